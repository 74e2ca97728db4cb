/*
 * base/trustfile.h - the one check of files the proxy must trust: the
 * auth file (its users' keys) and log_file (where every line goes).
 *
 * Thread: any.  It makes system calls on a path (open, fstat): call it at
 * start-up, on reload or from the log writer, never on the forwarding
 * loop.
 *
 * trustfile_open opens a path and checks the file it opened (fstat on the
 * descriptor, so nothing can swap the file between the check and the use)
 * against the rules the caller asks for: a regular file; with
 * TRUSTFILE_NOFOLLOW not a symbolic link (O_NOFOLLOW: a link planted at the
 * path by someone who may write its directory cannot send the proxy's
 * writes to a file of their choice); with TRUSTFILE_OWNER owned by the
 * proxy's effective user or by root (a file another user created, and can
 * still read, truncate or replace, is refused); and no permission bits the
 * caller forbids (group or others writing, others reading).  It does not
 * decide which rules a file needs: each caller says so, and why, by its
 * flags.
 */
#ifndef RELAYBUS_TRUSTFILE_H
#define RELAYBUS_TRUSTFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Rules of trustfile_open, or-ed. */
#define TRUSTFILE_NOFOLLOW 0x01          /* the last component is not a symbolic link */
#define TRUSTFILE_OWNER 0x02             /* owned by the effective user or by root */
#define TRUSTFILE_NO_GROUP_WRITE 0x04    /* mode has no g+w */
#define TRUSTFILE_NO_OTHERS_WRITE 0x08   /* mode has no o+w */
#define TRUSTFILE_NO_OTHERS_READ 0x10    /* mode has no o+r */
#define TRUSTFILE_ONE_LINK 0x20          /* no other hard link to it (one made to another file would write there) */

/* Which rule a refused file broke. */
typedef enum {
   TRUSTFILE_OK = 0,
   TRUSTFILE_ERR_OPEN,        /* open failed (errno's text in why; a link under NOFOLLOW too) */
   TRUSTFILE_ERR_NOT_REGULAR, /* a directory, a device, a FIFO... */
   TRUSTFILE_ERR_OWNER,       /* owned by another user */
   TRUSTFILE_ERR_MODE,        /* a forbidden permission bit is set */
   TRUSTFILE_ERR_LINKS,       /* TRUSTFILE_ONE_LINK: more than one hard link */
} trustfile_err_t;

/* Opens `path` with `flags` (O_CLOEXEC added; `mode` for O_CREAT) and
 * checks the opened file against `rules`.  The descriptor, which the
 * caller closes, or -1 with the broken rule in *err (may be NULL) and a
 * message in `why` that names the path, the file's owner or mode, and
 * the fix ("chmod go-w PATH").  A file refused after it was opened is
 * closed, never truncated or written. */
int trustfile_open (const char *path, int flags, mode_t mode, unsigned rules, trustfile_err_t *err, char *why, size_t why_len)
   __attribute__ ((warn_unused_result));

#endif /* RELAYBUS_TRUSTFILE_H */
