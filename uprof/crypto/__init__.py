"""Per-subject envelope encryption: key store, KEK handling and the event mapper."""
