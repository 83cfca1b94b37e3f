// Package architecture holds the test that keeps the code's layout as
// CONTRIBUTING.md draws it. It has no code of its own: the rules and their
// checks are in its tests, which `make test` runs with everything else.
//
// What the test refuses, in the code that ships (test files may reach any
// package or server to plant faults and watch the outcome):
//
//   - an import that points up or sideways between floors: cmd → api →
//     roles (ingest, scanner, alarm, timer, guard, stats, sinks, presence;
//     none imports another) → the engine (shard/queue) → shard and dispatch
//     (neither imports the other) → internal helpers; a package that has no
//     floor yet, so each new one is placed on purpose;
//   - rueidis imported anywhere but shard, the NATS client anywhere but dispatch
//     (and client, the Go library users import; the test kits; the demo);
//   - a test kit (internal/servers, internal/testenv) in the service;
//   - a non-test .go file over 400 lines outside bench/, unless it is
//     generated (Go's "Code generated ... DO NOT EDIT." line);
//   - a doc.go whose file map misses a file of its folder or names one
//     that is not there;
//   - more than 80 exported methods on shard's Store: cohesive ones go
//     behind a handle that one Store method returns (Watermarks, Timers).
//
// Files:
//
//	rules_test.go         the floors and the check of a tree
//	architecture_test.go  the check of this repository, and one planted
//	                      violation of each rule that it must catch
//	store_test.go         shard's Store keeps few exported methods
package architecture
