// Package periodic holds sigwatch's one periodic loop: call a function
// every period until the context ends.
//
// Pollers, refreshers and probes all want the same thing: a ticker, a
// select on ctx.Done, and the tick time handed to the work so that it
// need not read the clock again.
//
// Files:
//
//   - periodic.go: the periodic loop.
package periodic
