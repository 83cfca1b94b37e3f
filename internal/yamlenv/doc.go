// Package yamlenv loads a configuration struct: a YAML file over the
// defaults already in it, unknown keys refused, then environment variables
// named after each field's YAML path (redis.addrs -> PREFIX_REDIS_ADDRS;
// lists are comma-separated) over that. Its errors speak the user's words:
// the key path, the file and line or the variable, the nearest known key,
// and what a value should look like.
//
// Files:
//
//   - yamlenv.go: Load, the file and the environment over the defaults.
//   - check.go: the walk of a YAML document beside its struct that names
//     unknown keys and values of the wrong kind, and the nearest-key guess.
package yamlenv
