// The mixin's knobs. Override any of them in your own jsonnet:
//
//   (import 'idemgate/mixin/mixin.libsonnet') + {
//     _config+:: {
//       idemgateSelector: 'job="payments-idemgate"',
//       duplicateRatioThreshold: 0.2,
//     },
//   }
//
// or, for the shipped files, with scripts/generate-mixin.sh (see dashboards/README.md).
// Durations are Prometheus durations of one unit ('15m', '6h', '1d'); rates are per second.
{
  _config+:: {
    // Which series are idemgate's: one or more PromQL label matchers, comma-separated, put in
    // every selector of the rules and alerts (`up{…}` of IdemgateDown and IdemgateNoTraffic
    // included) and in the dashboard's `job` variable, which lists the jobs they match.
    idemgateSelector: 'job="idemgate"',

    // The label that tells clusters (or any other Prometheus-wide split, such as environments)
    // apart. Rules and alerts keep it when they aggregate and match on it, so one Prometheus
    // may watch several clusters; series without it work the same. The dashboard's `cluster`
    // variable filters by it, shown when showMultiCluster is true. The service's own label
    // `broker` (the kind of broker it consumes: rocketmq, rabbitmq, kafka), on every series it
    // exports, is kept and matched on the same way, and filtered by the `broker` variable.
    clusterLabel: 'cluster',
    showMultiCluster: false,

    // Every alert's runbook_url: this pattern with the alert's name in lower case (the anchors
    // of docs/runbook.md's headings). Point it at where you publish docs/runbook.md. The
    // service's own page of the problem goes in the annotation `ui_url`, read from
    // idemgate_build_info's ui_url label (http.public_url) when the alert is sent.
    runbookURLPattern: 'https://idemgate.example.com/docs/runbook.md#%s',

    // The Grafana dashboard.
    dashboardUid: 'idemgate',
    dashboardTitle: 'idemgate',
    dashboardTags: ['idemgate', 'rocketmq', 'rabbitmq', 'kafka'],
    dashboardRefresh: '30s',
    dashboardTimezone: '',

    // IdemgateConflictSpike: duplicates stopped per second over 5m are more than
    // conflictSpikeFactor times their own average over conflictSpikeBaseline (a recording
    // rule, named after it) and more than conflictSpikeMinPerSecond, for conflictSpikeFor.
    conflictSpikeFactor: 3,
    conflictSpikeMinPerSecond: 0.2,
    conflictSpikeBaseline: '6h',
    conflictSpikeFor: '5m',

    // IdemgateDuplicateRatioHigh: duplicates are more than this share of a biz_type's
    // deliveries, with more than duplicateRatioMinDeliveriesPerSecond deliveries.
    duplicateRatioThreshold: 0.1,
    duplicateRatioMinDeliveriesPerSecond: 0.1,
    duplicateRatioFor: '15m',

    // IdemgateRetryStorm: more than retryStormMinPerSecond redeliveries/s and more than
    // retryStormShare of the deliveries.
    retryStormMinPerSecond: 1,
    retryStormShare: 0.25,
    retryStormFor: '10m',

    // IdemgateProducerRetries: more than producerRetriesMinPerSecond duplicates/s of cause
    // producer_retry on a biz_type over 5m, for producerRetriesFor.
    producerRetriesMinPerSecond: 0.1,
    producerRetriesFor: '15m',

    // IdemgateRebalanceStorm: more than rebalanceStormMinPerSecond redelivered duplicates/s of
    // sub-cause rebalance in a consumer group over 5m, for rebalanceStormFor (longer than the
    // burst one rebalance brings).
    rebalanceStormMinPerSecond: 0.1,
    rebalanceStormFor: '15m',

    // IdemgateAckFailures: more than ackFailuresMinPerSecond redelivered duplicates/s of
    // sub-cause ack_lost in a consumer group over 5m, for ackFailuresFor.
    ackFailuresMinPerSecond: 0.05,
    ackFailuresFor: '10m',

    // IdemgateDeadLetters: more than deadLettersAbove dead letters within deadLettersWindow
    // (which is also how long one dead letter keeps it firing).
    deadLettersAbove: 0,
    deadLettersWindow: '15m',

    // IdemgateKeyCollision: how long one collision keeps it firing.
    keyCollisionWindow: '15m',

    // IdemgateArchiveStale: no successful archive pass for archiveStaleHours (the schedule
    // plus slack; a daily schedule by default).
    archiveStaleHours: 26,
    archiveStaleFor: '10m',

    // IdemgateArchiveFailing: the window of "failed, and nothing succeeded"; it should cover a
    // few scheduled runs.
    archiveFailingWindow: '6h',

    // IdemgateLogPartitionsBehind: the partitioned delivery log's newest day partition ends
    // less than logPartitionsAheadSeconds from now (the archive job keeps 3 to 4 days), for
    // logPartitionsBehindFor.
    logPartitionsAheadSeconds: 86400,
    logPartitionsBehindFor: '1h',

    // IdemgateLogOverflowRows: rows in the partitioned delivery log's overflow partition, for
    // logOverflowFor.
    logOverflowFor: '1h',

    // IdemgateNoTraffic: the deliveries/s the group must see on a topic for an instance's 0 to
    // mean something.
    noTrafficMinGroupPerSecond: 0.5,
    noTrafficFor: '15m',

    // IdemgateDown: how long a target may fail its scrapes.
    downFor: '2m',

    // IdemgateReconcileAnomalies: the kinds that are critical; the others are warnings.
    reconcileCriticalKinds: ['lost', 'double_applied'],

    // IdemgateRedisPrefilterDown: the share of an instance's pre-filtered deliveries that fell
    // back to the database alone over 5m.
    redisFallbackShare: 0.5,
    redisFallbackFor: '10m',

    // IdemgateGroupCommitSplitting: the share of an instance's groups split over
    // groupCommitWindow, with at least groupCommitMinGroupsPerMinute groups a minute.
    groupCommitSplitShare: 0.1,
    groupCommitWindow: '10m',
    groupCommitMinGroupsPerMinute: 1,
    groupCommitSplitFor: '10m',

    // IdemgateConsumerLagGrowing: more than consumerLagMinMessages behind, and the trend over
    // consumerLagTrendWindow still rising.
    consumerLagMinMessages: 1000,
    consumerLagTrendWindow: '15m',
    consumerLagFor: '10m',
  },
}
