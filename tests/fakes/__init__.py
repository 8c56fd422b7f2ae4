"""In-memory fakes for every port (P11)."""
