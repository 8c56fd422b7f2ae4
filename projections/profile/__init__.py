"""The profile read model: captures, attributes, memories, intents and consents."""
