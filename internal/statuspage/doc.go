// Package statuspage is the operator's status page the api role serves at
// GET /: one HTML page with its script and style embedded in the binary, so
// it works offline and needs no build step. The page holds no data of its
// own; its script reads the /v1 API with the operator's bearer token, so the
// page itself needs none.
//
// Files:
//
//   - statuspage.go: the handler of the page and its embedded files (ui/).
package statuspage
