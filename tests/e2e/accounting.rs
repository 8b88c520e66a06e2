//! Accounting reports: per owner, group and function, per period; figures equal the sum of the job records.
