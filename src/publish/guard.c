/*
 * publish/guard.c - the pure test of whether a client command writes the
 * outbox namespace, or reads it (see publish/guard.h for what each covers
 * and why).
 *
 * One table maps each command name that can write a named collection to
 * where that name is in the command.  Each check reads a fixed number of
 * top-level fields (bson_iter_init_find: a linear scan each) and walks at
 * most one array (a pipeline, nsInfo, applyOps' operations) once, so the
 * work is linear in the command's size.  applyOps may carry commands,
 * which are checked the same way, up to GUARD_MAX_DEPTH levels of nesting;
 * anything nested deeper is refused rather than walked.
 */
#include "publish/guard.h"

#include <string.h>

#include "base/outbox.h"

#define GUARD_MAX_DEPTH 4

typedef enum {
   GUARD_COLL,      /* {<cmd>: "<coll>", $db}: insert, drop, createIndexes, ... */
   GUARD_DATABASE,  /* dropDatabase of $db */
   GUARD_AGGREGATE, /* a $out or $merge stage */
   GUARD_MAPREDUCE, /* out: "<coll>" or {replace|merge|reduce: "<coll>", db} */
   GUARD_BULKWRITE, /* nsInfo: [{ns: "<db>.<coll>"}], in the body or a sequence */
   GUARD_RENAME,    /* {renameCollection: "<db>.<coll>", to: "<db>.<coll>"} */
   GUARD_CLONE,     /* {cloneCollectionAsCapped: "<src>", toCollection: "<coll>"} */
   GUARD_APPLYOPS,  /* applyOps: [{op, ns, o}] */
} guard_kind_t;

static const struct {
   const char *name;
   guard_kind_t kind;
} guard_commands[] = {
   {"insert", GUARD_COLL},
   {"update", GUARD_COLL},
   {"delete", GUARD_COLL},
   {"findAndModify", GUARD_COLL},
   {"findandmodify", GUARD_COLL},
   {"drop", GUARD_COLL},
   {"create", GUARD_COLL},
   {"createIndexes", GUARD_COLL},
   {"dropIndexes", GUARD_COLL},
   {"deleteIndexes", GUARD_COLL},
   {"collMod", GUARD_COLL},
   {"convertToCapped", GUARD_COLL},
   {"emptycapped", GUARD_COLL},
   {"dropDatabase", GUARD_DATABASE},
   {"aggregate", GUARD_AGGREGATE},
   {"mapReduce", GUARD_MAPREDUCE},
   {"mapreduce", GUARD_MAPREDUCE},
   {"bulkWrite", GUARD_BULKWRITE},
   {"renameCollection", GUARD_RENAME},
   {"cloneCollectionAsCapped", GUARD_CLONE},
   {"applyOps", GUARD_APPLYOPS},
};

/* The longest name in guard_commands ("cloneCollectionAsCapped"). */
#define GUARD_NAME_MAX 23

/* The table entry of command `cmd`, or -1: most commands are not in it,
 * and then nothing else of the body is read.  This runs for every request
 * on the forwarding loop, so a name is ruled out by its length and first
 * letter before any string comparison. */
static int
guard_command (const char *cmd)
{
   size_t len;

   /* The first letters of the names in guard_commands. */
   if (!cmd[0] || !strchr ("abcdefimru", cmd[0]))
      return -1;
   len = strnlen (cmd, GUARD_NAME_MAX + 1);
   if (len > GUARD_NAME_MAX)
      return -1;
   for (size_t i = 0; i < sizeof guard_commands / sizeof guard_commands[0]; i++) {
      const char *name = guard_commands[i].name;

      if (name[0] == cmd[0] && strlen (name) == len && memcmp (cmd, name, len) == 0)
         return (int) i;
   }
   return -1;
}

/* One check in progress: the namespace and where the verdict goes. */
typedef struct {
   const outbox_guard_ns_t *ns;
   char *why;
   size_t why_len;
} guard_t;

bool
outbox_guard_is_outbox (const outbox_guard_ns_t *ns, const char *db, size_t db_len, const char *coll, size_t coll_len)
{
   size_t plen = strlen (ns->prefix);

   if (strlen (ns->database) != db_len || memcmp (ns->database, db, db_len) != 0)
      return false;
   if (coll_len < plen || memcmp (ns->prefix, coll, plen) != 0)
      return false;
   for (int c = 0; c < OUTBOX_N_COLLECTIONS; c++) {
      const char *suffix = outbox_collection_suffix ((outbox_collection_t) c);

      if (strlen (suffix) == coll_len - plen && memcmp (suffix, coll + plen, coll_len - plen) == 0)
         return true;
   }
   return false;
}

/* Is `db` the outbox database?  Then say so in `why`, "<what> <db>". */
static bool
db_hit (guard_t *g, const char *what, const char *db, size_t db_len)
{
   if (!db || strlen (g->ns->database) != db_len || memcmp (g->ns->database, db, db_len) != 0)
      return false;
   if (g->why && g->why_len > 0)
      bson_snprintf (g->why, g->why_len, "%s %s", what, g->ns->database);
   return true;
}

/* Is db.coll an outbox collection?  Then say so in `why`: "<what>
 * <db>.<coll>", `what` naming the command and how it touches the
 * collection ("insert on", "aggregate $out into", "renameCollection from"). */
static bool
hit (guard_t *g, const char *what, const char *db, size_t db_len, const char *coll, size_t coll_len)
{
   if (!db || !coll || !outbox_guard_is_outbox (g->ns, db, db_len, coll, coll_len))
      return false;
   if (g->why && g->why_len > 0)
      bson_snprintf (g->why, g->why_len, "%s %.*s.%.*s", what, (int) db_len, db, (int) coll_len, coll);
   return true;
}

/* The same for a full namespace "<db>.<coll>". */
static bool
ns_hit (guard_t *g, const char *cmd, const char *ns, size_t len)
{
   const char *dot = memchr (ns, '.', len);

   if (!dot)
      return false;
   return hit (g, cmd, ns, (size_t) (dot - ns), dot + 1, len - (size_t) (dot - ns) - 1);
}

/* The string at `it`, when it is one. */
static bool
iter_str (const bson_iter_t *it, const char **s, size_t *len)
{
   uint32_t n;

   if (!BSON_ITER_HOLDS_UTF8 (it))
      return false;
   *s = bson_iter_utf8 (it, &n);
   *len = n;
   return true;
}

/* The string field `key` of `doc`, when there is one. */
static bool
find_str (const bson_t *doc, const char *key, const char **s, size_t *len)
{
   bson_iter_t it;

   return bson_iter_init_find (&it, doc, key) && iter_str (&it, s, len);
}

/* The command `body` names first (its first key, `it` left at it): its
 * index in the table `command` looks in (guard_command, read_command), or
 * -1. */
static int
command_of (const bson_t *body, bson_iter_t *it, int (*command) (const char *))
{
   if (!bson_iter_init (it, body) || !bson_iter_next (it))
      return -1;
   return command (bson_iter_key (it));
}

/* {<cmd>: "<coll>", ...}: "<cmd> on <db>.<coll>" (`it` at the first key). */
static bool
coll_hit (guard_t *g, const bson_iter_t *it, const char *db, size_t db_len)
{
   char what[48];
   const char *s;
   size_t len;

   bson_snprintf (what, sizeof what, "%s on", bson_iter_key (it));
   return iter_str (it, &s, &len) && hit (g, what, db, db_len, s, len);
}

/* Nested further than GUARD_MAX_DEPTH (`what`: applyOps, a pipeline):
 * taken as a hit rather than walked. */
static bool
too_deep (guard_t *g, const char *what)
{
   if (g->why && g->why_len > 0)
      bson_snprintf (g->why, g->why_len, "%s nested more than %d deep", what, GUARD_MAX_DEPTH);
   return true;
}

/* A target given as {db: "<db>", coll: "<coll>"} ($out, $merge's into),
 * the database defaulting to the command's. */
static bool
target_doc_hit (guard_t *g, const char *cmd, const bson_iter_t *it, const char *db, size_t db_len)
{
   bson_t doc;
   const uint8_t *data;
   uint32_t len;
   const char *coll, *tdb;
   size_t coll_len, tdb_len;

   bson_iter_document (it, &len, &data);
   if (!bson_init_static (&doc, data, len) || !find_str (&doc, "coll", &coll, &coll_len))
      return false;
   if (find_str (&doc, "db", &tdb, &tdb_len))
      return hit (g, cmd, tdb, tdb_len, coll, coll_len);
   return hit (g, cmd, db, db_len, coll, coll_len);
}

/* A $out or $merge stage's target. */
static bool
stage_hit (guard_t *g, const bson_iter_t *stage_it, const char *db, size_t db_len)
{
   bson_iter_t stage;
   const char *s;
   size_t len;

   if (!BSON_ITER_HOLDS_DOCUMENT (stage_it) || !bson_iter_recurse (stage_it, &stage) || !bson_iter_next (&stage))
      return false;
   if (strcmp (bson_iter_key (&stage), "$out") == 0) {
      if (iter_str (&stage, &s, &len))
         return hit (g, "aggregate $out into", db, db_len, s, len);
      if (BSON_ITER_HOLDS_DOCUMENT (&stage))
         return target_doc_hit (g, "aggregate $out into", &stage, db, db_len);
   } else if (strcmp (bson_iter_key (&stage), "$merge") == 0) {
      bson_iter_t into;

      if (iter_str (&stage, &s, &len))
         return hit (g, "aggregate $merge into", db, db_len, s, len);
      if (!BSON_ITER_HOLDS_DOCUMENT (&stage) || !bson_iter_recurse (&stage, &into) || !bson_iter_find (&into, "into"))
         return false;
      if (iter_str (&into, &s, &len))
         return hit (g, "aggregate $merge into", db, db_len, s, len);
      if (BSON_ITER_HOLDS_DOCUMENT (&into))
         return target_doc_hit (g, "aggregate $merge into", &into, db, db_len);
   }
   return false;
}

static bool
aggregate_hit (guard_t *g, const bson_t *body, const char *db, size_t db_len)
{
   bson_iter_t it, stages;

   if (!bson_iter_init_find (&it, body, "pipeline") || !BSON_ITER_HOLDS_ARRAY (&it) || !bson_iter_recurse (&it, &stages))
      return false;
   while (bson_iter_next (&stages)) {
      if (stage_hit (g, &stages, db, db_len))
         return true;
   }
   return false;
}

static bool
mapreduce_hit (guard_t *g, const bson_t *body, const char *db, size_t db_len)
{
   bson_iter_t it, out;
   const char *coll = NULL, *odb = db, *s;
   size_t coll_len = 0, odb_len = db_len, len;

   if (!bson_iter_init_find (&it, body, "out"))
      return false;
   if (iter_str (&it, &s, &len))
      return hit (g, "mapReduce out into", db, db_len, s, len);
   if (!BSON_ITER_HOLDS_DOCUMENT (&it) || !bson_iter_recurse (&it, &out))
      return false;
   while (bson_iter_next (&out)) {
      const char *key = bson_iter_key (&out);

      if (strcmp (key, "db") == 0)
         (void) iter_str (&out, &odb, &odb_len);
      else if (strcmp (key, "replace") == 0 || strcmp (key, "merge") == 0 || strcmp (key, "reduce") == 0)
         (void) iter_str (&out, &coll, &coll_len);
   }
   return hit (g, "mapReduce out into", odb, odb_len, coll, coll_len);
}

/* One nsInfo entry {ns: "<db>.<coll>", ...}. */
static bool
nsinfo_hit (guard_t *g, const bson_t *entry)
{
   const char *s;
   size_t len;

   return find_str (entry, "ns", &s, &len) && ns_hit (g, "bulkWrite on", s, len);
}

static bool
bulkwrite_hit (guard_t *g, const bson_t *body, const wire_sequence_t *seqs, uint32_t nseq)
{
   bson_iter_t it, entries;

   if (bson_iter_init_find (&it, body, "nsInfo") && BSON_ITER_HOLDS_ARRAY (&it) && bson_iter_recurse (&it, &entries)) {
      while (bson_iter_next (&entries)) {
         bson_t entry;
         const uint8_t *data;
         uint32_t len;

         if (!BSON_ITER_HOLDS_DOCUMENT (&entries))
            continue;
         bson_iter_document (&entries, &len, &data);
         if (bson_init_static (&entry, data, len) && nsinfo_hit (g, &entry))
            return true;
      }
   }
   for (uint32_t i = 0; i < nseq; i++) {
      const uint8_t *p = seqs[i].docs;
      uint32_t left = seqs[i].docs_len;

      if (strcmp (seqs[i].identifier, "nsInfo") != 0)
         continue;
      /* Concatenated documents, each starting with its int32 length (the
       * wire codec validated them; stay in bounds regardless). */
      while (left >= 5) {
         int32_t dlen;
         bson_t entry;

         memcpy (&dlen, p, sizeof dlen);
         dlen = BSON_UINT32_FROM_LE (dlen);
         if (dlen < 5 || (uint32_t) dlen > left)
            break;
         if (bson_init_static (&entry, p, (size_t) dlen) && nsinfo_hit (g, &entry))
            return true;
         p += dlen;
         left -= (uint32_t) dlen;
      }
   }
   return false;
}

static bool check (guard_t *g, const bson_t *body, const wire_sequence_t *seqs, uint32_t nseq, const char *db, size_t db_len, int depth);

/* applyOps: each operation's namespace; a command operation ("c", on
 * "<db>.$cmd") is checked as a command of that database. */
static bool
applyops_hit (guard_t *g, const bson_t *body, int depth)
{
   bson_iter_t it, ops;

   if (!bson_iter_init_find (&it, body, "applyOps") || !BSON_ITER_HOLDS_ARRAY (&it) || !bson_iter_recurse (&it, &ops))
      return false;
   while (bson_iter_next (&ops)) {
      bson_t op, o;
      bson_iter_t oit;
      const uint8_t *data;
      uint32_t len;
      const char *ns, *dot;
      size_t ns_len;

      if (!BSON_ITER_HOLDS_DOCUMENT (&ops))
         continue;
      bson_iter_document (&ops, &len, &data);
      if (!bson_init_static (&op, data, len) || !find_str (&op, "ns", &ns, &ns_len))
         continue;
      dot = memchr (ns, '.', ns_len);
      if (dot && ns + ns_len - (dot + 1) == 4 && memcmp (dot + 1, "$cmd", 4) == 0) {
         if (!bson_iter_init_find (&oit, &op, "o") || !BSON_ITER_HOLDS_DOCUMENT (&oit))
            continue;
         bson_iter_document (&oit, &len, &data);
         if (bson_init_static (&o, data, len) && check (g, &o, NULL, 0, ns, (size_t) (dot - ns), depth + 1))
            return true;
      } else if (ns_hit (g, "applyOps on", ns, ns_len)) {
         return true;
      }
   }
   return false;
}

/* The command `body` run on database `db` (NULL: unknown). */
static bool
check (guard_t *g, const bson_t *body, const wire_sequence_t *seqs, uint32_t nseq, const char *db, size_t db_len, int depth)
{
   bson_iter_t it;
   const char *s;
   size_t len;
   int i = command_of (body, &it, guard_command);

   if (i >= 0) {
      if (guard_commands[i].kind == GUARD_APPLYOPS && depth >= GUARD_MAX_DEPTH)
         return too_deep (g, "applyOps");
      switch (guard_commands[i].kind) {
      case GUARD_COLL:
         return coll_hit (g, &it, db, db_len);
      case GUARD_DATABASE:
         return db_hit (g, "dropDatabase of", db, db_len);
      case GUARD_AGGREGATE:
         return aggregate_hit (g, body, db, db_len);
      case GUARD_MAPREDUCE:
         return mapreduce_hit (g, body, db, db_len);
      case GUARD_BULKWRITE:
         return bulkwrite_hit (g, body, seqs, nseq);
      case GUARD_RENAME:
         if (iter_str (&it, &s, &len) && ns_hit (g, "renameCollection from", s, len))
            return true;
         return find_str (body, "to", &s, &len) && ns_hit (g, "renameCollection to", s, len);
      case GUARD_CLONE:
         return find_str (body, "toCollection", &s, &len) && hit (g, "cloneCollectionAsCapped into", db, db_len, s, len);
      case GUARD_APPLYOPS:
         return applyops_hit (g, body, depth);
      default:
         return false;
      }
   }
   return false;
}

/* A check's start: `why` emptied, and whether the first key of `body` is
 * a command of the table `command` looks in (guard_command, read_command);
 * then its database ($db, NULL when none) is read, else nothing more of
 * `body` is: this runs for every request. */
static bool
guard_start (guard_t *g, const bson_t *body, int (*command) (const char *), const char **db, size_t *db_len)
{
   bson_iter_t it;

   if (g->why && g->why_len > 0)
      g->why[0] = '\0';
   /* command_of's test, inline: one call less per request. */
   if (!bson_iter_init (&it, body) || !bson_iter_next (&it) || command (bson_iter_key (&it)) < 0)
      return false;
   *db = NULL;
   *db_len = 0;
   (void) find_str (body, "$db", db, db_len);
   return true;
}

bool
outbox_guard_writes (const bson_t *body,
                     const wire_sequence_t *seqs,
                     uint32_t nseq,
                     const outbox_guard_ns_t *ns,
                     char *why,
                     size_t why_len)
{
   guard_t g = {ns, why, why_len};
   const char *db;
   size_t db_len;

   return guard_start (&g, body, guard_command, &db, &db_len) && check (&g, body, seqs, nseq, db, db_len, 0);
}

/* ----------------------------------------------------------------- reads */

/* The commands that read a named collection's documents, and where the
 * name is. */
typedef enum {
   READ_COLL,      /* {<cmd>: "<coll>"}: find, count, distinct, mapReduce's source */
   READ_AGGREGATE, /* {aggregate: "<coll>" | 1, pipeline}: the collection and every stage that reads another */
   READ_GETMORE,   /* {getMore: id, collection: "<coll>"} */
   READ_VIEW,      /* {create|collMod: "<view>", viewOn: "<coll>", pipeline}: a view reads what it is on */
   READ_EXPLAIN,   /* {explain: {<command>}}: the command it explains (it may execute it) */
} read_kind_t;

static const struct {
   const char *name;
   read_kind_t kind;
} read_commands[] = {
   {"find", READ_COLL},          {"count", READ_COLL},       {"distinct", READ_COLL},
   {"mapReduce", READ_COLL},     {"mapreduce", READ_COLL},   {"aggregate", READ_AGGREGATE},
   {"getMore", READ_GETMORE},    {"create", READ_VIEW},      {"collMod", READ_VIEW},
   {"explain", READ_EXPLAIN},
};

static int
read_command (const char *cmd)
{
   if (!cmd[0] || !strchr ("fcdmage", cmd[0]))
      return -1;
   for (size_t i = 0; i < sizeof read_commands / sizeof read_commands[0]; i++)
      if (strcmp (read_commands[i].name, cmd) == 0)
         return (int) i;
   return -1;
}

static bool pipeline_reads (guard_t *g, const bson_iter_t *pipeline, const char *db, size_t db_len, int depth);

/* A {db, coll} or "<coll>" value naming a collection of `db` (or its own
 * db). */
static bool
named_reads (guard_t *g, const char *what, const bson_iter_t *it, const char *db, size_t db_len)
{
   const char *s;
   size_t len;

   if (iter_str (it, &s, &len))
      return hit (g, what, db, db_len, s, len);
   if (BSON_ITER_HOLDS_DOCUMENT (it))
      return target_doc_hit (g, what, it, db, db_len);
   return false;
}

/* One stage: those that read another collection ($lookup, $graphLookup,
 * $unionWith), those that hold pipelines ($lookup's, $unionWith's,
 * $facet's), and a change stream over every collection of the outbox
 * database or of the cluster. */
static bool
stage_reads (guard_t *g, const bson_iter_t *stage_it, const char *db, size_t db_len, int depth)
{
   bson_iter_t stage, f;
   const char *name;

   if (!BSON_ITER_HOLDS_DOCUMENT (stage_it) || !bson_iter_recurse (stage_it, &stage) || !bson_iter_next (&stage))
      return false;
   name = bson_iter_key (&stage);
   if (name[0] != '$')
      return false;
   if (strcmp (name, "$lookup") == 0 || strcmp (name, "$graphLookup") == 0) {
      if (!BSON_ITER_HOLDS_DOCUMENT (&stage) || !bson_iter_recurse (&stage, &f))
         return false;
      while (bson_iter_next (&f)) {
         if (strcmp (bson_iter_key (&f), "from") == 0 && named_reads (g, name[1] == 'l' ? "$lookup from" : "$graphLookup from", &f, db, db_len))
            return true;
         if (strcmp (bson_iter_key (&f), "pipeline") == 0 && pipeline_reads (g, &f, db, db_len, depth + 1))
            return true;
      }
      return false;
   }
   if (strcmp (name, "$unionWith") == 0) {
      if (BSON_ITER_HOLDS_UTF8 (&stage))
         return named_reads (g, "$unionWith", &stage, db, db_len);
      if (!BSON_ITER_HOLDS_DOCUMENT (&stage) || !bson_iter_recurse (&stage, &f))
         return false;
      while (bson_iter_next (&f)) {
         if (strcmp (bson_iter_key (&f), "coll") == 0 && named_reads (g, "$unionWith", &f, db, db_len))
            return true;
         if (strcmp (bson_iter_key (&f), "pipeline") == 0 && pipeline_reads (g, &f, db, db_len, depth + 1))
            return true;
      }
      return false;
   }
   if (strcmp (name, "$facet") == 0) {
      if (!BSON_ITER_HOLDS_DOCUMENT (&stage) || !bson_iter_recurse (&stage, &f))
         return false;
      while (bson_iter_next (&f))
         if (pipeline_reads (g, &f, db, db_len, depth + 1))
            return true;
      return false;
   }
   return false;
}

static bool
pipeline_reads (guard_t *g, const bson_iter_t *pipeline, const char *db, size_t db_len, int depth)
{
   bson_iter_t stages;

   if (!BSON_ITER_HOLDS_ARRAY (pipeline) || !bson_iter_recurse (pipeline, &stages))
      return false;
   if (depth > GUARD_MAX_DEPTH)
      return too_deep (g, "a pipeline");
   while (bson_iter_next (&stages))
      if (stage_reads (g, &stages, db, db_len, depth))
         return true;
   return false;
}

/* Whether the first stage of `body`'s pipeline is a $changeStream, and
 * with allChangesForCluster. */
static bool
change_stream (const bson_t *body, bool *cluster)
{
   bson_iter_t it, stages, stage, opt;

   *cluster = false;
   if (!bson_iter_init_find (&it, body, "pipeline") || !BSON_ITER_HOLDS_ARRAY (&it) || !bson_iter_recurse (&it, &stages) ||
       !bson_iter_next (&stages) || !BSON_ITER_HOLDS_DOCUMENT (&stages) || !bson_iter_recurse (&stages, &stage) ||
       !bson_iter_next (&stage) || strcmp (bson_iter_key (&stage), "$changeStream") != 0)
      return false;
   if (BSON_ITER_HOLDS_DOCUMENT (&stage) && bson_iter_recurse (&stage, &opt) && bson_iter_find (&opt, "allChangesForCluster"))
      *cluster = bson_iter_as_bool (&opt);
   return true;
}

static bool
reads (guard_t *g, const bson_t *body, const char *db, size_t db_len, int depth)
{
   bson_iter_t it, f;
   const char *s;
   size_t len;
   int i = command_of (body, &it, read_command);

   if (i < 0)
      return false;
   switch (read_commands[i].kind) {
   case READ_COLL:
      return coll_hit (g, &it, db, db_len);
   case READ_AGGREGATE: {
      bool cluster;

      if (iter_str (&it, &s, &len) && hit (g, "aggregate on", db, db_len, s, len))
         return true;
      if (!iter_str (&it, &s, &len) && change_stream (body, &cluster)) {
         /* A database's change stream sees every collection of it; a
          * cluster's, every database. */
         if (db_hit (g, "a change stream on database", db, db_len))
            return true;
         if (cluster) {
            if (g->why && g->why_len > 0)
               bson_snprintf (g->why, g->why_len, "a change stream on the whole cluster (it shows %s)", g->ns->database);
            return true;
         }
      }
      return bson_iter_init_find (&f, body, "pipeline") && pipeline_reads (g, &f, db, db_len, depth);
   }
   case READ_GETMORE:
      return find_str (body, "collection", &s, &len) && hit (g, "getMore on", db, db_len, s, len);
   case READ_VIEW:
      if (find_str (body, "viewOn", &s, &len) && hit (g, "a view on", db, db_len, s, len))
         return true;
      return bson_iter_init_find (&f, body, "viewOn") && bson_iter_init_find (&f, body, "pipeline") &&
             pipeline_reads (g, &f, db, db_len, depth);
   case READ_EXPLAIN: {
      bson_t inner;
      const uint8_t *data;
      uint32_t dlen;

      if (!BSON_ITER_HOLDS_DOCUMENT (&it))
         return false;
      if (depth >= GUARD_MAX_DEPTH)
         return too_deep (g, "a pipeline");
      bson_iter_document (&it, &dlen, &data);
      return bson_init_static (&inner, data, dlen) && reads (g, &inner, db, db_len, depth + 1);
   }
   default:
      return false;
   }
}

bool
outbox_guard_reads (const bson_t *body, const outbox_guard_ns_t *ns, char *why, size_t why_len)
{
   guard_t g = {ns, why, why_len};
   const char *db;
   size_t db_len;

   return guard_start (&g, body, read_command, &db, &db_len) && reads (&g, body, db, db_len, 0);
}
