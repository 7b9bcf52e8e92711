(import 'idemgate.libsonnet')
