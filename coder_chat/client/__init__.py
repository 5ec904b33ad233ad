"""The only network code: REST over httpx, the chat stream over websockets."""
