"""Pure protocol code: wire models, the turn translator, backoff and retry judgment.

Nothing here performs I/O; the client feeds it what arrives on the wire.
"""
