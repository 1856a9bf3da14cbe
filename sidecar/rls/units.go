package rls

import (
	"strings"
	"time"
)

// Unit is the unit of a limit's window, numbered as envoy.service.ratelimit.v3's
// RateLimitResponse.RateLimit.Unit (envoy.type.v3.RateLimitUnit has the same numbers
// from SECOND to YEAR, and no WEEK).
type Unit int32

// The units.
const (
	UnitUnknown Unit = 0
	Second      Unit = 1
	Minute      Unit = 2
	Hour        Unit = 3
	Day         Unit = 4
	Month       Unit = 5
	Year        Unit = 6
	Week        Unit = 7
)

var unitNames = map[string]Unit{
	"UNKNOWN": UnitUnknown, "SECOND": Second, "MINUTE": Minute, "HOUR": Hour,
	"DAY": Day, "WEEK": Week, "MONTH": Month, "YEAR": Year,
}

// parseUnit reads a rule file's unit in any letter case, as the reference does
// (strings.ToUpper, then the enum's names). known is false for a name that is not a
// unit; UNKNOWN is known but not valid.
func parseUnit(s string) (u Unit, known bool) {
	u, known = unitNames[strings.ToUpper(s)]
	return u, known
}

// Seconds is the unit's length as the reference counts it: a month is 30 days and a year
// 365, both counted from the Unix epoch; a week starts on Thursday, as 1970-01-01 did.
// It is 0 for UNKNOWN and for numbers that are not a unit.
func (u Unit) Seconds() int64 {
	switch u {
	case Second:
		return 1
	case Minute:
		return 60
	case Hour:
		return 3600
	case Day:
		return 86_400
	case Week:
		return 7 * 86_400
	case Month:
		return 30 * 86_400
	case Year:
		return 365 * 86_400
	}
	return 0
}

// String is the unit's name in the protos.
func (u Unit) String() string {
	for name, v := range unitNames {
		if v == u {
			return name
		}
	}
	return "UNKNOWN"
}

// MaxWindow bounds a window of unit_multiplier units: ten years of 365 days.
const MaxWindow = 10 * 365 * 24 * time.Hour

// Code is a decision, numbered as RateLimitResponse.Code.
type Code int32

// The decisions.
const (
	CodeUnknown Code = 0
	OK          Code = 1
	OverLimit   Code = 2
)
