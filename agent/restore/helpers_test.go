package restore

import "time"

var testTime = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
