"""Real HTTP servers that behave like the clouds' metadata services, for tests, the bench and
`scheduledeventsd simulate`; never imported by the daemon."""
