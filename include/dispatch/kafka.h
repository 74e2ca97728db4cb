/*
 * dispatch/kafka.h - kind = kafka (dispatch/kafka.c, librdkafka): what
 * the configuration's checks need besides the handler interface
 * (transport_kafka_ops in dispatch/transport.h).
 *
 * Only in a build with librdkafka (autoconf.h: RELAYBUS_HAVE_KAFKA).
 *
 * Thread: any (the configuration's checks run on the main thread and on a
 * reload).
 */
#ifndef RELAYBUS_KAFKA_H
#define RELAYBUS_KAFKA_H

#include <stdbool.h>

#include <bson/bson.h>

/* Whether librdkafka accepts `name = value` for a producer (a
 * kafka.<name> line of a handler); false with librdkafka's message in
 * `error` (config_checks_t.kafka_property_valid).  Any thread. */
bool kafka_property_valid (const char *name, const char *value, bson_error_t *error);

#endif /* RELAYBUS_KAFKA_H */
