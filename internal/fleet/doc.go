// Package fleet simulates a fleet of devices publishing signals over MQTT,
// some of which go silent for a while and come back. sigwatch demo and
// sigwatch simulate use it; tests use it as a realistic load.
//
// Files:
//
//   - fleet.go: the simulated fleet and its devices.
package fleet
