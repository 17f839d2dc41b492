"""Errors every layer may raise, defined below all of them so that no lower layer imports an upper one."""


class ConfigError(ValueError):
    """A bad configuration value; the message is one line."""
