/*
 * test_keyhash.c - src/base/keyhash.c: SipHash-2-4 gives the reference
 * implementation's vectors (key 00..0f, messages 00..n-1, every tail
 * length and a second block), and the key of keyhash is drawn per
 * process: two processes hash the same bytes differently.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/keyhash.h"

/* The 64-bit outputs of the reference (vectors_sip64, as integers) for
 * messages of 0 to 16 bytes. */
static const uint64_t vectors[] = {
   0x726fdb47dd0e0e31ull, 0x74f839c593dc67fdull, 0x0d6c8009d9a94f5aull, 0x85676696d7fb7e2dull, 0xcf2794e0277187b7ull,
   0x18765564cd99a68dull, 0xcbc9466e58fee3ceull, 0xab0200f58b01d137ull, 0x93f5f5799a932462ull, 0x9e0082df0ba9e4b0ull,
   0x7a5dbbc594ddb9f3ull, 0xf4b32f46226bada7ull, 0x751e8fbc860ee5fbull, 0x14ea5627c0843d90ull, 0xf723ca908e7af2eeull,
   0xa129ca6149be45e5ull, 0x3f2acc7f57c29bdbull,
};

static void
test_vectors (void **state)
{
   uint8_t key[KEYHASH_KEY_LEN], msg[16];

   (void) state;
   for (int i = 0; i < KEYHASH_KEY_LEN; i++)
      key[i] = (uint8_t) i;
   for (int i = 0; i < 16; i++)
      msg[i] = (uint8_t) i;
   for (size_t n = 0; n < sizeof vectors / sizeof vectors[0]; n++)
      if (keyhash_siphash24 (key, msg, n) != vectors[n])
         fail_msg ("%zu bytes: %016llx, want %016llx", n, (unsigned long long) keyhash_siphash24 (key, msg, n),
                   (unsigned long long) vectors[n]);
}

/* keyhash of fixed bytes in a new process (fork: the parent has not drawn
 * its key yet when this runs first, so each child draws its own). */
static uint64_t
hash_in_child (void)
{
   int fds[2];
   pid_t pid;
   uint64_t h = 0;
   int status;

   assert_int_equal (pipe (fds), 0);
   pid = fork ();
   assert_true (pid >= 0);
   if (pid == 0) {
      uint64_t v = keyhash ("relaybus", 8);
      _exit (write (fds[1], &v, sizeof v) == sizeof v ? 0 : 1);
   }
   close (fds[1]);
   assert_int_equal (read (fds[0], &h, sizeof h), (ssize_t) sizeof h);
   close (fds[0]);
   assert_int_equal (waitpid (pid, &status, 0), pid);
   assert_true (WIFEXITED (status) && WEXITSTATUS (status) == 0);
   return h;
}

static void
test_key_per_process (void **state)
{
   uint64_t a = hash_in_child (), b = hash_in_child (), c = hash_in_child (), mine;
   uint8_t zero[KEYHASH_KEY_LEN] = {0};

   (void) state;
   /* Three draws of 128 bits: two equal outputs would mean a fixed key
    * (by chance: 2^-64). */
   assert_true (a != b && b != c && a != c);
   mine = keyhash ("relaybus", 8);
   assert_int_equal (mine, keyhash ("relaybus", 8)); /* stable within the process */
   assert_true (mine != keyhash_siphash24 (zero, "relaybus", 8));
   assert_true (mine != keyhash ("relaybut", 8));
}

int
main (void)
{
   const struct CMUnitTest tests[] = {
      /* First: the parent must not have drawn its key before the forks. */
      cmocka_unit_test (test_key_per_process),
      cmocka_unit_test (test_vectors),
   };
   return cmocka_run_group_tests (tests, NULL, NULL);
}
