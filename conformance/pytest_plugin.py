"""pytest plugin entry point (options and checks are added by the checks issue)."""
