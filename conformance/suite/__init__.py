"""The packaged conformance suite collected by the pytest plugin."""
