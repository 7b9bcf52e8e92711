// The recording rules: rates and ratios per consumer group and biz_type (or topic), summed
// over the instances of a group. Named level:metric:operations: the labels the series keeps
// (besides the cluster label and `broker`), the metric it is computed from (without `_total`; a
// selected outcome appended, as in `idemgate_deliveries_duplicate`), and what was done to it.
//
// Every series of the service carries `broker`, the kind of broker it consumes (rocketmq,
// rabbitmq, kafka): every aggregation keeps it, so that services on different brokers never
// mix, even with consumer groups, topics and biz_types of the same names.
local text = import '../lib/text.libsonnet';

{
  // The names the alerts and the documentation refer to.
  _recorded+:: {
    deliveries: 'consumer_group_biz_type:idemgate_deliveries:rate5m',
    duplicates: 'consumer_group_biz_type:idemgate_deliveries_duplicate:rate5m',
    duplicateRatio: 'consumer_group_biz_type:idemgate_deliveries_duplicate_per_deliveries:ratio_rate5m',
    conflicts: 'consumer_group_biz_type:idemgate_conflicts:rate5m',
    conflictBaseline: 'consumer_group_biz_type:idemgate_conflicts:rate' + $._config.conflictSpikeBaseline,
    failed: 'consumer_group_biz_type:idemgate_deliveries_failed:rate5m',
    redeliveries: 'consumer_group_biz_type:idemgate_redeliveries:rate5m',
    redeliveryRatio: 'consumer_group_biz_type:idemgate_redeliveries_per_deliveries:ratio_rate5m',
    topicDeliveries: 'consumer_group_topic:idemgate_deliveries:rate5m',
    instanceTopicDeliveries: 'instance_consumer_group_topic:idemgate_deliveries:rate5m',
    consumerLag: 'consumer_group_topic:idemgate_consumer_lag_messages:sum_max',
  },

  prometheusRules+:: {
    local c = $._config,
    local r = $._recorded,
    local sel(metric, matchers=[]) = text.selector(metric, [c.idemgateSelector] + matchers),
    local by(names) = text.labels([c.clusterLabel, 'broker'] + names),
    local groupBiz = by(['consumer_group', 'biz_type']),

    groups+: [
      {
        name: 'idemgate.recording',
        rules: [
          {
            record: r.deliveries,
            expr: 'sum by (%s) (rate(%s[5m]))' % [groupBiz, sel('idemgate_deliveries_total')],
            comment:: |||
              Deliveries per second, every outcome (processed, duplicate, failed, dead_lettered,
              invalid). A failed attempt and its retry are two deliveries.
            |||,
          },
          {
            record: r.duplicates,
            expr: 'sum by (%s) (rate(%s[5m]))' % [groupBiz, sel('idemgate_deliveries_total', ['outcome="duplicate"'])],
            comment:: |||
              Duplicates per second: deliveries skipped and acknowledged because the effect was
              already applied.
            |||,
          },
          {
            record: r.duplicateRatio,
            expr: '%s / (%s > 0)' % [r.duplicates, r.deliveries],
            comment:: 'Duplicates / all deliveries, 0..1. No sample without deliveries (see above).',
          },
          {
            record: r.conflicts,
            expr: 'sum by (%s) (rate(%s[5m]))' % [groupBiz, sel('idemgate_conflicts_total')],
            comment:: 'Duplicates stopped per second, every defence layer and cause together.',
          },
          {
            record: r.conflictBaseline,
            expr: 'sum by (%s) (rate(%s[%s]))' % [groupBiz, sel('idemgate_conflicts_total'), c.conflictSpikeBaseline],
            comment:: |||
              The conflict rate's own baseline for IdemgateConflictSpike: the average over %s.
              A short burst barely moves it, a lasting change becomes the new normal within hours.
            ||| % text.words(c.conflictSpikeBaseline),
          },
          {
            record: r.failed,
            expr: 'sum by (%s) (rate(%s[5m]))' % [groupBiz, sel('idemgate_deliveries_total', ['outcome="failed"'])],
            comment:: 'Failed attempts per second (the handler asked for a retry, or the database failed).',
          },
          {
            record: r.redeliveries,
            expr: 'sum by (%s) (rate(%s[5m]))' % [groupBiz, sel('idemgate_redeliveries_total')],
            comment:: 'Redeliveries per second: deliveries whose broker reconsume count is above 0.',
          },
          {
            record: r.redeliveryRatio,
            expr: '%s / (%s > 0)' % [r.redeliveries, r.deliveries],
            comment:: 'Redeliveries / all deliveries, 0..1. No sample without deliveries.',
          },
          {
            record: r.topicDeliveries,
            expr: 'sum by (%s) (rate(%s[5m]))' % [by(['consumer_group', 'topic']), sel('idemgate_deliveries_total')],
            comment:: |||
              Deliveries per second of a consumer group on a topic, all its instances together
              (IdemgateNoTraffic: the topic has traffic).
            |||,
          },
          {
            record: r.instanceTopicDeliveries,
            expr: 'sum by (%s) (rate(%s[5m]))' % [by(['job', 'instance', 'consumer_group', 'topic']), sel('idemgate_deliveries_total')],
            comment:: |||
              Deliveries per second of one instance on a topic, job kept (IdemgateNoTraffic: this
              instance gets none of it).
            |||,
          },
          {
            record: r.consumerLag,
            expr: 'sum by (%s) (max by (%s) (%s))' % [
              by(['consumer_group', 'topic']),
              by(['consumer_group', 'topic', 'broker_name', 'queue']),
              sel('idemgate_consumer_lag_messages'),
            ],
            comment:: |||
              Messages a consumer group has not consumed yet on a topic, over every queue: RocketMQ
              queues of every broker (broker_name), Kafka partitions, or RabbitMQ's queue of the group
              and its delay queue. Each instance of the group reads the same queues and exports the
              same series, so the instances are collapsed with max per queue before the queues are
              summed.
            |||,
          },
        ],
      },
    ],
  },
}
