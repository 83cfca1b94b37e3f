// Package yamlenv loads a configuration struct: a YAML file over the
// defaults already in it, unknown keys refused, then environment variables
// named after each field's YAML path (redis.addrs -> PREFIX_REDIS_ADDRS;
// lists are comma-separated) over that.
//
// Files:
//
//   - yamlenv.go: Load, the file and the environment over the defaults.
package yamlenv
