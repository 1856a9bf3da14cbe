package limiter

import "unsafe"

// unsafeString is a string over b's bytes, as a caller that reuses a buffer builds one.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
