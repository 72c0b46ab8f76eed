"""Moved to scheduledeventsd.config.schema (issue 27); kept while branches that import it from
here are merged. Import scheduledeventsd.config.schema."""

from .config.schema import *  # noqa: F403
