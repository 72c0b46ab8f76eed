"""scheduledeventsd: prepare a VM for the maintenance Azure, AWS and Google Cloud announce to it:
run the hooks configured for each notice and, on Azure, approve the event once they succeed."""

__version__ = "0.1.0"
