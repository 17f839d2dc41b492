"""Errors every layer may raise, defined below all of them so that no lower layer imports an upper one."""


class ConfigError(ValueError):
    """A bad configuration value; the message is one line."""


class InputError(ValueError):
    """A bad input file or path given to a command (a results tree, a pack, a markdown file to rewrite); the message
    is one line naming the value and what is allowed. Commands refuse these in one line; any other ValueError is a
    bug and keeps its traceback."""
