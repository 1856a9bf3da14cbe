package ids

import "testing"

func TestIsUUID(t *testing.T) {
	for _, s := range []string{"6f1c2a52-4f7e-4b8e-9a51-0d6b0c3c1a10", "6F1C2A52-4F7E-4B8E-9A51-0D6B0C3C1A10"} {
		if !IsUUID(s) {
			t.Errorf("IsUUID(%q) = false", s)
		}
	}
	for _, s := range []string{"", "x", "6f1c2a52-4f7e-4b8e-9a51-0d6b0c3c1a1", "6f1c2a52-4f7e-4b8e-9a51-0d6b0c3c1a100",
		"6f1c2a524f7e-4b8e-9a51-0d6b0c3c1a10-", "6f1c2a52-4f7e-4b8e-9a51-0d6b0c3c1a1g", "{6f1c2a52-4f7e-4b8e-9a51-0d6b0c3c1a1}"} {
		if IsUUID(s) {
			t.Errorf("IsUUID(%q) = true", s)
		}
	}
}
