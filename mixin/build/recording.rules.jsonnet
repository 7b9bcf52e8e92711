// dashboards/prometheus/recording.rules.yml, with the defaults of config.libsonnet merged with
// `config` (jsonnet --tla-code config='{…}').
function(config={})
  local mixin = (import '../mixin.libsonnet') + { _config+:: config };
  (import '../lib/rulefile.libsonnet').manifest(mixin.prometheusRules, |||
    idemgate recording rules. Generated from mixin/ by scripts/generate-mixin.sh: do not edit
    this file; set the selector in mixin/config.libsonnet, or in your own jsonnet over the
    mixin (dashboards/README.md).

    Selector: %(selector)s. Every series here is a sum over the instances of a consumer group,
    computed by Prometheus from the counters each instance exports, so it stays right when
    instances come, go or restart. Ratios are sums of rates divided by sums of rates (never an
    average of per-instance ratios). The cluster label (%(cluster)s) is kept wherever the
    inputs have it, and so is `broker`, the kind of broker the service consumes (rocketmq,
    rabbitmq, kafka), which every series of the service carries: services on different brokers
    never mix.

    Naming: level:metric:operations. The level names the labels a series keeps, the metric
    the counter it is computed from (a selected outcome appended), the operations what was done.

    Ratios are only recorded where there was traffic: a consumer group and biz_type with no
    deliveries in the window has no ratio sample at all (instead of NaN from 0/0), so a panel
    shows a gap and no ratio alert can fire on an idle biz_type.

    Load with the alerts (alerts.rules.yml uses these series):
      rule_files: [recording.rules.yml, alerts.rules.yml]
  ||| % { selector: mixin._config.idemgateSelector, cluster: mixin._config.clusterLabel })
