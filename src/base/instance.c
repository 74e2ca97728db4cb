/*
 * base/instance.c - the process's serviceId (base/instance.h).
 *
 * Made once under pthread_once, so the forwarding loops, the admin thread
 * and main may ask first in any order; read without a lock afterwards (it
 * never changes).  libbson's default context makes an ObjectId from the
 * time, a random value per process and a counter: two proxies started in
 * the same second still differ.
 */
#include "base/instance.h"

#include <pthread.h>

static bson_oid_t service_id;
static pthread_once_t service_id_once = PTHREAD_ONCE_INIT;

static void
service_id_init (void)
{
   bson_oid_init (&service_id, NULL);
}

const bson_oid_t *
instance_service_id (void)
{
   pthread_once (&service_id_once, service_id_init);
   return &service_id;
}
