//go:build !demo

package main

// testFreeze is the alarm worker's freeze seam, only in builds with the
// demo tag (freeze.go).
func testFreeze() (func(string), error) { return nil, nil }
