"""The base of every error whose message teaches (a failed check, a wrong device function, a missing
instruction): JupyterLab shows its message alone, without the library's frames. No torch import, so
that the light modules (the CUDA build helper) can use it."""
from __future__ import annotations


class TeachingError(AssertionError):
    """An AssertionError whose message is the feedback."""

    def _render_traceback_(self) -> list[str]:
        """What IPython (and so JupyterLab) shows in place of the traceback: the class's name, then
        every line of the teaching message; the check's own frames would only bury the cause.
        ipykernel still sends ``ename`` and ``evalue`` as for any error, which grading reads."""
        notes = [str(n) for n in getattr(self, "__notes__", ())]
        return [f"\x1b[1;31m{type(self).__name__}:\x1b[0m", *str(self).splitlines(), *notes]
