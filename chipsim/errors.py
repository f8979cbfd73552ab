"""One error type for every bad input: the CLI prints its message on one line and exits non-zero."""

import argparse



class InputError(Exception):
    """A problem with a user's input (config, trace, command line), stated in one line."""

    def __init__(self, message: str):
        # one line whatever the message quotes: a newline becomes a space, any other character that is not
        # printable (a form feed, a vertical tab, U+2028, ...) its escape
        message = message.replace("\n", " ")
        super().__init__("".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                                 for c in message))


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line, `chipsim: error: ...`, exit code 2, like every
    other bad input (argparse's own prints the whole usage first). Every chipsim command line uses it."""

    def error(self, message):
        self.exit(2, f"chipsim: error: {self.prog}: {message} (see {self.prog} --help)\n")


def run_module_main(main) -> None:
    """`python -m chipsim.<module>` entry point: its `main()` exit code, or an InputError as one line
    `chipsim: error: ...` and exit 2 (as the chipsim command gives it)."""
    import sys

    try:
        code = main()
    except InputError as exc:
        print(f"chipsim: error: {exc}", file=sys.stderr)
        code = 2
    sys.exit(code)


def torch_device(torch, name: str, option: str = "--device"):
    """torch.device(name), or one line naming the option where torch knows no such device or sees no CUDA GPU."""
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise InputError(f"{option} {name}: not a torch device ({str(exc).splitlines()[0]})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"{option} {name}: torch {torch.__version__} sees no CUDA GPU (--device cpu runs on the CPU)")
    return device
