"""The configuration's error type, apart so that the loader's helpers can raise it."""


class ConfigError(ValueError):
    """A user-caused configuration mistake; the message is the whole explanation."""
