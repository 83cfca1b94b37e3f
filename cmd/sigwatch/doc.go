// Command sigwatch watches fleets of IoT devices for signal loss.
//
//	sigwatch run [--config sigwatch.yaml]   run the service (roles: ingest, scanner, alarm, api)
//	sigwatch demo                           run everything on embedded servers with a simulated fleet (make demo)
//	sigwatch dev                            run the service on Redis, Mosquitto and NATS it starts (make run)
//	sigwatch simulate --broker URL          publish signals of a simulated fleet to any broker
//	sigwatch shards status|double           show the topology and every shard; double the shards
//	sigwatch device get|rm|threshold|group|ack ID look at or change one device through the API
//	sigwatch mute add|ls|rm                 mute alarms of a device or a type for a while
//	sigwatch events [--lost] [--device ID]  follow the events sigwatch publishes
//
// The command only parses, wires and serves; what sigwatch does lives in
// its packages, the HTTP routes in package api. Where things live here:
//   - main.go: the subcommands and signal handling.
//   - config.go: Config, composed of the sections each package owns, loaded
//     from YAML with the SIGWATCH_* environment overlaid; unknown keys are
//     refused (internal/yamlenv reads it). configcheck.go: sigwatch config
//     check and healthcheck.
//   - run.go: App and Start; wire.go: each step of wiring the roles to
//     Redis, NATS and the broker; group.go runs them as an ordered group
//     that stops in reverse; metrics.go: the NATS connection gauge;
//     advisories.go: the NATS MQTT listener's client advisories fed to
//     ingest as connection events.
//   - apiclient.go: how every CLI verb reaches the API (--api, --token,
//     --timeout, one-line errors) and shows times; apitls.go: its TLS
//     (--ca, --cert, --key) and what a failed handshake means; admin.go: the device and
//     mute commands; lists.go, storms.go, stats.go, timers.go, types.go,
//     sinks.go, audit.go: the listing, storm, stats, timer, type, sink and
//     audit commands; shards.go: sigwatch shards, through
//     the API or, with --config, on Redis directly; events.go: sigwatch
//     events, which follows GET /v1/events.
//   - simulate.go: a simulated fleet; demo.go: the demo (build tag demo),
//     demo_sparkplug.go: its Sparkplug B edge node, whose connection dies
//     and comes back; nodemo.go: its stand-in (and dev's) without the tag; dev.go:
//     `sigwatch dev`, the service on servers it starts (build tag demo);
//     devservers.go: the servers the demo and dev start, on the standard
//     ports where free.
//   - freeze.go: a test seam that stops an alarm worker between a
//     transition and its notification (build tag demo); freeze_nodemo.go:
//     none without the tag.
package main
