/*
 * base/trustfile.c - opening a file the proxy must trust (see
 * base/trustfile.h): open, then the checks on the descriptor.
 *
 * The checks run on what was opened (fstat), not on the path (stat then
 * open could check one file and open another).  A symbolic link is
 * refused by O_NOFOLLOW itself, whose ELOOP is reported as such.  The open
 * never blocks: O_NONBLOCK, taken off again once the file is known to be a
 * regular one, so that a FIFO (whose open for writing waits for a reader,
 * for ever and through SIGTERM) is refused at once like any other file
 * that is not a regular one.  No allocation; the message is cut to the
 * caller's buffer.
 */
#include "base/trustfile.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The forbidden bits of `rules`, as a mode mask. */
static mode_t
forbidden_bits (unsigned rules)
{
   mode_t bits = 0;

   if (rules & TRUSTFILE_NO_GROUP_WRITE)
      bits |= S_IWGRP;
   if (rules & TRUSTFILE_NO_OTHERS_WRITE)
      bits |= S_IWOTH;
   if (rules & TRUSTFILE_NO_OTHERS_READ)
      bits |= S_IROTH;
   return bits;
}

/* "go-w", "o-rw"...: the chmod that removes `bits`. */
static void
chmod_hint (mode_t bits, char *out, size_t len)
{
   bool g = bits & S_IWGRP, o = bits & (S_IWOTH | S_IROTH);

   snprintf (out, len, "%s%s-%s%s", g ? "g" : "", o ? "o" : "", (bits & S_IROTH) ? "r" : "", (bits & (S_IWGRP | S_IWOTH)) ? "w" : "");
}

int
trustfile_open (const char *path, int flags, mode_t mode, unsigned rules, trustfile_err_t *err, char *why, size_t why_len)
{
   trustfile_err_t e = TRUSTFILE_OK;
   struct stat st;
   mode_t bad;
   int fd;

   fd = open (path, flags | O_CLOEXEC | O_NONBLOCK | ((rules & TRUSTFILE_NOFOLLOW) ? O_NOFOLLOW : 0), mode);
   if (fd < 0) {
      e = TRUSTFILE_ERR_OPEN;
      if (errno == ELOOP && (rules & TRUSTFILE_NOFOLLOW))
         snprintf (why, why_len, "%s is a symbolic link: give the path of the file itself", path);
      else if (errno == ENXIO) {
         /* A FIFO opened for writing without a reader, or a device
          * without its hardware. */
         e = TRUSTFILE_ERR_NOT_REGULAR;
         snprintf (why, why_len, "%s: not a regular file (a FIFO or a device)", path);
      } else
         snprintf (why, why_len, "%s: cannot open: %s", path, strerror (errno));
      goto done;
   }
   if (fstat (fd, &st) != 0) {
      e = TRUSTFILE_ERR_OPEN;
      snprintf (why, why_len, "%s: cannot stat: %s", path, strerror (errno));
      goto done;
   }
   if (!S_ISREG (st.st_mode)) {
      e = TRUSTFILE_ERR_NOT_REGULAR;
      snprintf (why, why_len, "%s: not a regular file%s", path, S_ISFIFO (st.st_mode) ? " (a FIFO)" : "");
      goto done;
   }
   if ((rules & TRUSTFILE_ONE_LINK) && st.st_nlink > 1) {
      e = TRUSTFILE_ERR_LINKS;
      snprintf (why, why_len, "%s has %u hard links: it may be another file's name too; give a file of its own", path,
                (unsigned) st.st_nlink);
      goto done;
   }
   {
      int fl = fcntl (fd, F_GETFL);
      if (fl < 0 || fcntl (fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
         e = TRUSTFILE_ERR_OPEN;
         snprintf (why, why_len, "%s: cannot make it blocking: %s", path, strerror (errno));
         goto done;
      }
   }
   /* Root may do anything to the file anyway; any other owner is someone
    * the proxy would be trusting besides itself. */
   if ((rules & TRUSTFILE_OWNER) && st.st_uid != geteuid () && st.st_uid != 0) {
      e = TRUSTFILE_ERR_OWNER;
      snprintf (why, why_len, "%s is owned by uid %u, not by the proxy's user (uid %u) or root: chown it, or remove it and let the proxy create it",
                path, (unsigned) st.st_uid, (unsigned) geteuid ());
      goto done;
   }
   bad = st.st_mode & forbidden_bits (rules);
   if (bad) {
      /* Others are named by what the rules forbid them ("readable or
       * writable" for a file of keys), not only by the bit found. */
      const char *others = (rules & TRUSTFILE_NO_OTHERS_READ) && (rules & TRUSTFILE_NO_OTHERS_WRITE) ? "readable or writable by others"
                           : (rules & TRUSTFILE_NO_OTHERS_READ)                                       ? "readable by others"
                                                                                                      : "writable by others";
      bool g = bad & S_IWGRP, o = bad & (S_IWOTH | S_IROTH);
      mode_t fix = forbidden_bits (rules) & ~(g ? (mode_t) 0 : S_IWGRP) & ~(o ? (mode_t) 0 : (S_IWOTH | S_IROTH));
      char hint[16];

      e = TRUSTFILE_ERR_MODE;
      chmod_hint (fix, hint, sizeof hint);
      snprintf (why, why_len, "%s: %s%s%s (mode %03o): chmod %s %s", path, g ? "writable by its group" : "", g && o ? " and " : "",
                o ? others : "", (unsigned) (st.st_mode & 0777), hint, path);
      goto done;
   }

done:
   if (e != TRUSTFILE_OK && fd >= 0) {
      close (fd);
      fd = -1;
   }
   if (err)
      *err = e;
   return fd;
}
