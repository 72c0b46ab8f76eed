"""The clouds' metadata services: the IMDS HTTP client (imds) that Azure's events come through,
AWS's and Google Cloud's notices mapped into the same events, and the VM's name (identity).
Which cloud this is belongs to the configuration (config/provider.py); nothing here knows the
configuration or the engine."""
