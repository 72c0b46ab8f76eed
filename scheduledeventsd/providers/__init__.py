"""The clouds' metadata services: which cloud this is (detect), the IMDS HTTP client (imds) that
Azure's events come through, AWS's and Google Cloud's notices mapped into the same events, and
the VM's name (identity). Nothing here knows the configuration or the engine."""
