// Package webhooks signs and verifies webhooks as Standard Webhooks 1.0 says
// (https://www.standardwebhooks.com): three headers, webhook-id, webhook-timestamp (unix seconds)
// and webhook-signature, the last a space-separated list of "v1,<base64 HMAC-SHA256>" over
// "id.timestamp.body", one per secret, so that a receiver keeps working while the sender rotates
// its secret.
//
// Secrets are written as the spec writes them, "whsec_" and the key in base64; the bare base64
// is accepted too, as the spec's reference libraries do. Raw bytes are not: a secret read from a
// file or the environment would otherwise be ambiguous (is "abc=" a key or its encoding?), and
// receivers are handed the whsec_ form. Keys shorter than 24 bytes, the spec's lower bound, are
// refused.
//
// It uses only the standard library, so that the sinks that send and the test receivers that
// check use the one implementation.
//
// Files:
//
//   - webhooks.go: secrets (Secret, ParseSecret, NewSecret), signing (Sign,
//     Header) and verifying (Verify) with its errors.
package webhooks
