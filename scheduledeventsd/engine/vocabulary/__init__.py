"""The words the engine and the daemon speak: messages in, effects out, and the constants."""
