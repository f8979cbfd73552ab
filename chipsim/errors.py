"""One error type for every bad input: the CLI prints its message on one line and exits non-zero."""

import argparse



class InputError(Exception):
    """A problem with a user's input (config, trace, command line), stated in one line."""

    def __init__(self, message: str):
        super().__init__(message.replace("\n", " "))


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line, `chipsim: error: ...`, exit code 2, like every
    other bad input (argparse's own prints the whole usage first). Every chipsim command line uses it."""

    def error(self, message):
        self.exit(2, f"chipsim: error: {self.prog}: {message} (see {self.prog} --help)\n")
