"""scheduledeventsd: run hooks for Azure Scheduled Events, then approve them."""

__version__ = "0.1.0"
