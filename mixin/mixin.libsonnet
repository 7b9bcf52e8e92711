// The idemgate monitoring mixin: Prometheus recording rules and alerts and a Grafana dashboard,
// in the shape of kubernetes-mixin and node-mixin. Import it and override `_config`
// (config.libsonnet lists every knob):
//
//   local idemgate = (import 'mixin.libsonnet') + { _config+:: { idemgateSelector: 'job="payments-idemgate"' } };
//   {
//     'idemgate.rules.yml': std.manifestYamlDoc(idemgate.prometheusRules),
//     'idemgate.alerts.yml': std.manifestYamlDoc(idemgate.prometheusAlerts),
//     'idemgate.json': idemgate.grafanaDashboards['idemgate.json'],
//   }
//
// scripts/generate-mixin.sh writes the files shipped in dashboards/ from it.
(import 'config.libsonnet')
+ (import 'rules/rules.libsonnet')
+ (import 'alerts/alerts.libsonnet')
+ (import 'dashboards/dashboards.libsonnet')
