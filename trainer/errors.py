"""The one exception type for bad user input, so the entry point can print it without a traceback."""


class ConfigError(Exception):
    """A bad key, value or combination in the user's config.

    The message is a complete, one-paragraph explanation that names the key and what is allowed;
    ``trainer.cli`` prints it as-is and exits with status 2, before any training starts.
    """

    exit_code = 2
