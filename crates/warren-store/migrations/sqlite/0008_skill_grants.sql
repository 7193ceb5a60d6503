-- Skills granted to a uid from the operator's catalog (I32): with the built-in and shared
-- skills they make the uid's read-only projection at /home/gem/skills.
CREATE TABLE skill_grants (
    uid TEXT NOT NULL,
    slug TEXT NOT NULL,
    granted_at INTEGER NOT NULL,
    PRIMARY KEY (uid, slug)
);
