"""recoveryd: a recovery daemon for an HTTP message delivery service."""

__version__ = "0.1.0"
