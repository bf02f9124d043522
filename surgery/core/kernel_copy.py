"""Copy a byte range between two open files in the kernel (``copy_file_range``: page cache to page
cache, as ``cp`` does), or say that it cannot, so that the caller copies through a buffer."""

from __future__ import annotations

import errno
import os

# What copy_file_range answers when it cannot copy between these two files (another filesystem, a
# device such as /dev/null, an old kernel): the caller copies the bytes itself.
_REFUSED = (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF)


def kernel_copy(fd_src: int, fd_dst: int, src_pos: int, dst_pos: int, n: int) -> bool:
    """Copy ``n`` bytes from ``fd_src`` at ``src_pos`` to ``fd_dst`` at ``dst_pos`` in the kernel; False
    where the OS has no ``copy_file_range`` or the kernel refuses it for these files (what it copied
    before refusing is to be written again by the caller). Any other error is raised."""
    if not hasattr(os, "copy_file_range"):  # Linux only
        return False
    done = 0
    try:
        while done < n:
            copied = os.copy_file_range(fd_src, fd_dst, n - done, src_pos + done, dst_pos + done)
            if copied == 0:
                raise OSError(errno.EIO, "the source ended early while copying it")
            done += copied
    except OSError as exc:
        if exc.errno not in _REFUSED:
            raise
        return False
    return True
