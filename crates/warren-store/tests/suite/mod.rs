//! The behaviour suite, run against every store backend.
//!
//! `behaviour` holds backend-agnostic checks, each an `async fn(&dyn Backend)`. The
//! `behaviour_suite!` macro turns every check into one `#[tokio::test]` per backend, so a
//! PostgreSQL store joins the suite by adding one `Backend` and one macro line below.

mod backends;
mod behaviour;
mod fixtures;
mod postgres;
mod sqlite;

/// Declares one test module per backend, with one test per behaviour check.
macro_rules! behaviour_suite {
    ($module:ident => $backend:expr) => {
        mod $module {
            behaviour_suite!(@checks $backend;
                claiming_an_unclaimed_sandbox_creates_generation_one,
                claiming_a_live_sandbox_on_the_same_workdir_joins_it,
                claiming_a_live_sandbox_on_another_workdir_is_a_conflict_that_changes_nothing,
                claiming_a_live_sandbox_under_another_network_policy_is_a_conflict,
                claiming_a_live_sandbox_under_another_env_policy_is_a_conflict,
                a_live_sandbox_keeps_its_layout_and_a_new_generation_may_take_another,
                extra_mounts_are_stored_in_order_and_a_live_sandbox_keeps_them,
                a_live_sandbox_keeps_its_isolation_and_a_new_generation_may_take_another,
                an_agent_environment_is_kept_per_uid_and_replaced_whole,
                setting_one_agent_variable_adds_or_overwrites_within_the_limit,
                egress_secrets_rotate_in_place_and_stay_apart_per_sandbox,
                a_new_egress_secret_past_the_limit_is_refused,
                egress_events_are_read_after_a_cursor_and_trimmed_to_the_newest,
                two_servers_racing_for_an_authority_agree_on_one,
                artifacts_are_recorded_listed_and_found_per_sandbox,
                checkpoints_are_recorded_listed_and_forgotten,
                skills_are_granted_and_revoked_per_uid,
                every_state_but_terminated_counts_as_live_for_a_claim,
                a_claim_whose_id_is_not_derived_from_its_uid_and_scope_is_refused,
                fifty_concurrent_claims_of_one_identity_create_exactly_one_sandbox,
                reclaiming_a_terminated_sandbox_bumps_its_generation_and_may_take_a_new_workdir,
                concurrent_reclaims_of_a_terminated_sandbox_bump_the_generation_once,
                a_stale_generation_cannot_change_the_sandbox_state,
                the_current_generation_moves_the_sandbox_through_its_states,
                a_state_change_from_a_state_the_sandbox_has_left_changes_nothing,
                labels_and_a_deadline_come_with_a_new_generation_and_are_replaced_whole,
                only_live_sandboxes_past_their_deadline_are_due_earliest_first,
                touching_a_sandbox_moves_only_its_last_activity,
                starting_and_finishing_a_run_count_as_sandbox_activity,
                leases_count_while_live_and_expire_unless_renewed,
                sandboxes_are_listed_per_uid_oldest_first,
                a_run_is_recorded_from_start_to_finish,
                a_run_warren_could_not_complete_is_recorded_as_failed,
                a_finished_run_cannot_be_finished_again,
                runs_are_refused_for_unknown_sandboxes_and_duplicate_ids,
                runs_are_listed_newest_first_up_to_the_limit,
                failing_running_runs_closes_only_the_runs_still_running,
                a_runs_kind_tag_and_terminal_are_recorded_and_listed,
                runs_are_filtered_by_status_and_start_time_in_either_scope,
                a_uid_lists_the_runs_of_its_own_sandboxes_only,
                paging_through_runs_started_in_one_millisecond_loses_and_repeats_none,
                recording_a_workdir_twice_reports_it_new_only_once,
                one_workdir_record_is_read_and_forgotten_by_uid_and_path,
                workdirs_are_listed_per_uid_oldest_first,
                branches_are_named_once_per_workdir_and_bound_only_without_a_runtime,
                a_guard_is_exclusive_until_released_and_each_new_holder_gets_a_larger_token,
                a_lapsed_guard_is_free_and_cannot_be_renewed,
                only_the_newest_token_passes_the_fence,
                guard_tokens_keep_growing_across_generations,
                a_guard_on_a_sandbox_never_claimed_is_refused,
                concurrent_acquisitions_of_a_free_guard_grant_it_exactly_once,
                a_renewal_naming_no_ttl_extends_by_the_last_one_granted,
                an_alias_names_one_sandbox_for_good_and_is_recorded_idempotently,
                an_alias_of_a_sandbox_never_claimed_is_refused,
                a_transport_record_is_written_only_at_the_version_its_writer_read,
                each_registration_of_a_node_takes_a_new_epoch_that_supersedes_the_old,
                a_node_lease_lapses_unless_renewed_and_a_lapsed_epoch_cannot_renew,
                a_node_that_leaves_is_listed_as_left_and_cannot_renew,
                concurrent_registrations_of_one_node_id_take_distinct_epochs,
                a_runtime_has_one_owner_and_a_live_owner_is_deferred_to,
                a_takeover_from_a_lapsed_owner_fences_its_writes_and_closes_its_runs,
                a_restarted_node_adopts_only_the_runtimes_still_recorded_as_its_own,
                recovery_closes_only_the_runs_of_its_own_node,
                concurrent_claims_of_one_runtime_leave_exactly_one_owner,
                a_migration_begun_twice_with_the_same_digest_is_resumed_unchanged,
                a_migration_begun_again_with_another_digest_is_refused_and_changes_nothing,
                a_migration_that_names_an_item_twice_is_refused_and_writes_nothing,
                a_migration_item_advances_only_from_the_state_it_is_in,
                the_workdir_given_with_a_step_is_recorded_with_it_and_a_refused_step_records_none,
                migration_items_come_back_ordered_by_key_with_what_each_step_wrote,
                the_state_of_a_migration_is_compare_and_set,
                migrations_are_listed_oldest_first,
                concurrent_steps_of_one_item_let_exactly_one_win_and_record_only_its_workdir,
            );
        }
    };
    (@checks $backend:expr; $($check:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $check() {
                let backend = $backend;
                crate::suite::behaviour::$check(&backend).await;
            }
        )*
    };
}

behaviour_suite!(sqlite_in_memory => crate::suite::backends::SqliteInMemory);
behaviour_suite!(sqlite_file => crate::suite::backends::SqliteFile::new());
behaviour_suite!(postgresql => crate::suite::backends::Postgres::new());
