//! Accounting reports over the job records: per owner, group or function, per period.
