// Package docs holds the tests that keep the manuals true to the
// repository. It has no code of its own; its tests, which `make test` runs
// with everything else, fail when:
//
//   - a relative link or #anchor in README.md, CONTRIBUTING.md or docs/
//     names a file or heading that is not there;
//   - any file of the tree (bench/ and deploy/ included) cites a document
//     that is not in the repository;
//   - README.md grows past 300 lines, its contents list and its headings
//     disagree, or words of the trade come before its first walkthrough.
//
// docs/configuration.md is checked against the configuration's defaults by
// cmd/sigwatch's TestConfigurationDocMatchesDefaults, which can read them.
//
// Files:
//
//	docs_test.go  the checks
package docs
