// Package ids checks the identifier formats of the platform, so that malformed ids are
// refused before they reach a query or a cache.
package ids

// IsUUID reports whether s is a UUID in its canonical textual form
// (8-4-4-4-12 hexadecimal digits, either case).
func IsUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
	}
	return true
}
