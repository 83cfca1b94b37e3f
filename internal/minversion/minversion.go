package minversion

import (
	"strconv"
	"strings"
)

// AtLeast reports whether version found is need or newer, comparing the
// major, minor and patch numbers; a missing number counts as 0 and a
// suffix ("-rc1", "+build") is ignored. ok is false when found has no
// leading number at all: the caller cannot tell and should say so.
func AtLeast(found, need string) (newer, ok bool) {
	f, ok := parse(found)
	if !ok {
		return false, false
	}
	n, _ := parse(need)
	for i := range f {
		if f[i] != n[i] {
			return f[i] > n[i], true
		}
	}
	return true, true
}

// parse reads up to three dot-separated numbers of v.
func parse(v string) (out [3]int, ok bool) {
	v = strings.TrimPrefix(strings.TrimSpace(v), "v")
	if i := strings.IndexAny(v, "-+ "); i >= 0 {
		v = v[:i]
	}
	for i, part := range strings.SplitN(v, ".", 3) {
		n, err := strconv.Atoi(part)
		if err != nil {
			return out, i > 0
		}
		out[i] = n
	}
	return out, true
}
