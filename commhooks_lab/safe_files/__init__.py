"""The one way the lab reads and writes files it did not make: a course folder off a USB stick, a results folder
to compare, a checkpoint handed around.

A folder handed around may hold a link out of it, a FIFO that blocks a reader forever, a device that never ends,
or JSON built to exhaust the parser. So, with the standard library only (no well-kept library does all of it;
``pathlib`` follows links, and neither ``shutil`` nor ``tempfile`` opens relative to a folder's descriptor):

- the folder the learner names is opened once (``O_DIRECTORY``); every name in it is opened relative to that
  descriptor (``dir_fd``), one component at a time, with ``O_NOFOLLOW``: no link inside is ever followed;
- a name is looked at with ``lstat`` before it is opened (a device is never opened), opened with ``O_NONBLOCK``
  (a FIFO swapped in meanwhile cannot block) and checked again with ``fstat`` + ``S_ISREG`` on the descriptor;
- reads stop at a limit counted in bytes actually read, not ``st_size`` (0 for a device);
- JSON is parsed by :mod:`json` with integers of at most :data:`MAX_INT_DIGITS` digits, and nesting deeper than
  the C scanner's recursion limit is refused by name (never a bare ``RecursionError``);
- a file is written under a new hidden name (``O_CREAT | O_EXCL | O_NOFOLLOW``), synced, then renamed into place:
  a reader never sees half of it, and a full disk leaves the old file whole.

Every refusal is an :class:`UnsafeFileError` that names the file and says what to do.
"""

from .errors import FileTooLarge, UnsafeFileError, shown
from .folder import Folder, Staged
from .json_limits import MAX_INT_DIGITS, parse_json
from .single import read_file

__all__ = ["FileTooLarge", "Folder", "MAX_INT_DIGITS", "Staged", "UnsafeFileError", "parse_json", "read_file", "shown"]
