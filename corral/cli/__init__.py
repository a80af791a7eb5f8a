"""cli: the ``corral`` command; talks only to the API client and manages the embedded server."""
