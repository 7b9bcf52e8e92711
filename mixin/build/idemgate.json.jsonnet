// dashboards/idemgate.json, with the defaults of config.libsonnet merged with `config`
// (jsonnet --tla-code config='{…}').
function(config={})
  local mixin = (import '../mixin.libsonnet') + { _config+:: config };
  mixin.grafanaDashboards['idemgate.json']
