"""Exceptions whose message is the whole story, so the entry point prints them without a traceback."""


class UserFacingError(Exception):
    """An error the user can act on; ``trainer.cli`` prints its message and exits with ``exit_code``."""

    exit_code = 1

    def __str__(self) -> str:
        # raised in a DataLoader worker, torch re-raises it in the main process as the same class with
        # "Caught X in DataLoader worker process N. Original Traceback ..." around the message: keep the message
        text = super().__str__()
        if text.startswith("Caught ") and "Original Traceback" in text:
            last = text.rstrip().splitlines()[-1]
            return last.split(": ", 1)[1] if ": " in last else last
        return text


def cause_text(e: BaseException) -> str:
    """An error's cause (Hydra's InstantiationException wraps the real one) as one line for a paragraph."""
    return " ".join(line.strip() for line in str(e.__cause__ or e).splitlines() if line.strip())


class ConfigError(UserFacingError):
    """A bad key, value or combination in the user's config, or bad input data.

    The message is a complete, one-paragraph explanation that names the key and what is allowed;
    it is raised before any training starts.
    """

    exit_code = 2


class TrainingStopped(UserFacingError):
    """Training stopped on purpose (a non-finite loss with on_nan=stop, a bad sample with
    data.on_bad_sample=stop); the message names the step or file and the last good checkpoint."""

    exit_code = 3
