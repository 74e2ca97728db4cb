/*
 * tests/tools/kafka-mock.c - a Kafka "broker" for the integration tests:
 * librdkafka's mock cluster (rd_kafka_mock_cluster_new), whose brokers
 * listen on real TCP ports of 127.0.0.1, so the proxy and an independent
 * client (kafkajs) connect to it as to a Kafka cluster.  Kafka has no
 * Debian package; this is the test suite's stand-in, not a broker to run.
 *
 * Usage: kafka-mock [--brokers N]   (1 to 9; default 1)
 *
 * Prints the bootstrap servers (host:port,...) as the first line of its
 * standard output, then reads one command a line from standard input and
 * answers each with a line starting "ok" or "error":
 *
 *   create TOPIC PARTITIONS   make a topic (the cluster creates no topic
 *                             on its own for a client that does not ask)
 *   refuse TOPIC              metadata answers UNKNOWN_TOPIC_OR_PART for
 *                             TOPIC (the mock creates any topic a producer
 *                             asks for, whatever allow.auto.create.topics)
 *   down | up                 every broker refuses (closes) connections /
 *                             serves again (rd_kafka_mock_broker_set_down/up)
 *   quit                      or end of input: destroys the cluster, exits 0
 *
 * Not a broker: no persistence, no authentication, and the mock's own
 * limits on the protocol.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#define KAFKA_MOCK_BROKERS_MAX 9

static void
set_all (rd_kafka_mock_cluster_t *mc, int n, int up)
{
   for (int id = 1; id <= n; id++)
      if (up)
         rd_kafka_mock_broker_set_up (mc, id);
      else
         rd_kafka_mock_broker_set_down (mc, id);
}

int
main (int argc, char **argv)
{
   char errstr[512], line[512];
   rd_kafka_conf_t *conf;
   rd_kafka_t *rk;
   rd_kafka_mock_cluster_t *mc;
   int n = 1;

   for (int i = 1; i < argc; i++) {
      if (!strcmp (argv[i], "--brokers") && i + 1 < argc)
         n = atoi (argv[++i]);
      else {
         fprintf (stderr, "usage: kafka-mock [--brokers N]\n");
         return 2;
      }
   }
   if (n < 1 || n > KAFKA_MOCK_BROKERS_MAX) {
      fprintf (stderr, "kafka-mock: --brokers: 1 to %d\n", KAFKA_MOCK_BROKERS_MAX);
      return 2;
   }
   /* The cluster needs a client instance to run on; this one sends
    * nothing. */
   conf = rd_kafka_conf_new ();
   if (rd_kafka_conf_set (conf, "log_level", "3", errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
      fprintf (stderr, "kafka-mock: %s\n", errstr);
      rd_kafka_conf_destroy (conf);
      return 1;
   }
   rk = rd_kafka_new (RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
   if (!rk) {
      fprintf (stderr, "kafka-mock: %s\n", errstr);
      rd_kafka_conf_destroy (conf);
      return 1;
   }
   mc = rd_kafka_mock_cluster_new (rk, n);
   if (!mc) {
      fprintf (stderr, "kafka-mock: cannot create the mock cluster\n");
      rd_kafka_destroy (rk);
      return 1;
   }
   printf ("%s\n", rd_kafka_mock_cluster_bootstraps (mc));
   fflush (stdout);

   while (fgets (line, sizeof line, stdin)) {
      char topic[256];
      int parts;
      rd_kafka_resp_err_t err;

      line[strcspn (line, "\r\n")] = '\0';
      if (!strcmp (line, "quit"))
         break;
      if (!strcmp (line, "down") || !strcmp (line, "up")) {
         set_all (mc, n, line[0] == 'u');
         printf ("ok %s\n", line);
      } else if (sscanf (line, "refuse %255s", topic) == 1) {
         rd_kafka_mock_topic_set_error (mc, topic, RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART);
         printf ("ok refuse %s\n", topic);
      } else if (sscanf (line, "create %255s %d", topic, &parts) == 2 && parts > 0) {
         err = rd_kafka_mock_topic_create (mc, topic, parts, n < 3 ? n : 3);
         if (err)
            printf ("error %s\n", rd_kafka_err2str (err));
         else
            printf ("ok create %s %d\n", topic, parts);
      } else
         printf ("error unknown command: %s\n", line);
      fflush (stdout);
   }
   rd_kafka_mock_cluster_destroy (mc);
   rd_kafka_destroy (rk);
   return 0;
}
