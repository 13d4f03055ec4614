/* test_pjrt_abi.c: our PJRT declarations (csrc/runtime/pjrt_api.h) against
 * the upstream pjrt_c_api.h that the installed plugin wheel ships, and against
 * the loaded plugin (argv[1]).
 *
 * Compiled at test time with -I<the wheel's include folder>; the upstream
 * header is never part of the tree. For every struct we declare: each field's
 * offset and size equal upstream's; where our last field exists upstream, our
 * struct_size (offset of the last field + its size) equals upstream's
 * <name>_STRUCT_SIZE; where we declare newer fields than this header has, only
 * the common prefix is checked and the difference is reported. Then the
 * function table: every entry of TPU_PJRT_ENTRIES at upstream's offset, and
 * present in the plugin's table for the entries the runtime calls. The last
 * line is "N passed, M failed"; the exit status is non-zero on any failure.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "core.h"
#include "pjrt_c_api.h"
#include "runtime/pjrt_api.h"
#include "runtime/runtime.h"

#include "check.h"

#define FSIZE(type, f) sizeof(((type *)0)->f)

/* Our field f of `ours` sits where upstream's g of `theirs` does, with the same size. */
#define SAME(ours, f, theirs, g)                                                                             \
  CHECK(offsetof(ours, f) == offsetof(theirs, g) && FSIZE(ours, f) == FSIZE(theirs, g),                      \
        #ours "." #f " at %zu (size %zu), upstream " #theirs "." #g " at %zu (size %zu)", offsetof(ours, f), \
        FSIZE(ours, f), offsetof(theirs, g), FSIZE(theirs, g))

#define HEAD(ours, theirs)                      \
  SAME(ours, struct_size, theirs, struct_size); \
  SAME(ours, extension_start, theirs, extension_start)

/* Our last field exists upstream: the struct_size we send must be upstream's. */
#define SIZE(ours, last, theirs)                                                             \
  CHECK(TPU_PJRT_SIZE(ours, last) == (size_t)theirs##_STRUCT_SIZE,                           \
        #ours ": struct_size %zu (through " #last "), upstream " #theirs "_STRUCT_SIZE %zu", \
        TPU_PJRT_SIZE(ours, last), (size_t)theirs##_STRUCT_SIZE)

/* Two enumerators (of different enums) with the same value. */
#define ENUM(ours, theirs) \
  CHECK((int)(ours) == (int)(theirs), #ours " = %d, upstream " #theirs " = %d", (int)(ours), (int)(theirs))

static int longer; /* structs where we declare more than this header */

/* Our struct is longer than upstream's (newer fields, or an opaque tail): the
 * prefix is checked by SAME; here the size is reported. */
static void report_longer(const char *ours, size_t our_size, const char *theirs, size_t their_size, const char *why) {
  CHECK(our_size >= their_size, "%s: struct_size %zu is below upstream %s %zu (the plugin would reject it)", ours,
        our_size, theirs, their_size);
  if (our_size > their_size) {
    longer++;
    printf(
        "note: %s sends struct_size %zu, longer than %s_STRUCT_SIZE %zu in this header (%s; the common prefix "
        "matches)\n",
        ours, our_size, theirs, their_size, why);
  }
}

static void test_structs(void) {
  /* API version */
  HEAD(tpu_pjrt_version, PJRT_Api_Version);
  SAME(tpu_pjrt_version, major_version, PJRT_Api_Version, major_version);
  SAME(tpu_pjrt_version, minor_version, PJRT_Api_Version, minor_version);
  SIZE(tpu_pjrt_version, minor_version, PJRT_Api_Version);

  /* errors */
  HEAD(tpu_pjrt_error_destroy_args, PJRT_Error_Destroy_Args);
  SAME(tpu_pjrt_error_destroy_args, error, PJRT_Error_Destroy_Args, error);
  SIZE(tpu_pjrt_error_destroy_args, error, PJRT_Error_Destroy_Args);

  HEAD(tpu_pjrt_error_message_args, PJRT_Error_Message_Args);
  SAME(tpu_pjrt_error_message_args, error, PJRT_Error_Message_Args, error);
  SAME(tpu_pjrt_error_message_args, message, PJRT_Error_Message_Args, message);
  SAME(tpu_pjrt_error_message_args, message_size, PJRT_Error_Message_Args, message_size);
  SIZE(tpu_pjrt_error_message_args, message_size, PJRT_Error_Message_Args);

  HEAD(tpu_pjrt_error_code_args, PJRT_Error_GetCode_Args);
  SAME(tpu_pjrt_error_code_args, error, PJRT_Error_GetCode_Args, error);
  SAME(tpu_pjrt_error_code_args, code, PJRT_Error_GetCode_Args, code);
  SIZE(tpu_pjrt_error_code_args, code, PJRT_Error_GetCode_Args);

  /* plugin, events */
  HEAD(tpu_pjrt_plugin_init_args, PJRT_Plugin_Initialize_Args);
  SIZE(tpu_pjrt_plugin_init_args, extension_start, PJRT_Plugin_Initialize_Args);

  HEAD(tpu_pjrt_event_args, PJRT_Event_Destroy_Args);
  SAME(tpu_pjrt_event_args, event, PJRT_Event_Destroy_Args, event);
  SIZE(tpu_pjrt_event_args, event, PJRT_Event_Destroy_Args);
  HEAD(tpu_pjrt_event_args, PJRT_Event_Await_Args);
  SAME(tpu_pjrt_event_args, event, PJRT_Event_Await_Args, event);
  SIZE(tpu_pjrt_event_args, event, PJRT_Event_Await_Args);
  HEAD(tpu_pjrt_event_is_ready_args, PJRT_Event_IsReady_Args);
  SAME(tpu_pjrt_event_is_ready_args, event, PJRT_Event_IsReady_Args, event);
  SAME(tpu_pjrt_event_is_ready_args, is_ready, PJRT_Event_IsReady_Args, is_ready);
  SIZE(tpu_pjrt_event_is_ready_args, is_ready, PJRT_Event_IsReady_Args);
  HEAD(tpu_pjrt_event_on_ready_args, PJRT_Event_OnReady_Args);
  SAME(tpu_pjrt_event_on_ready_args, event, PJRT_Event_OnReady_Args, event);
  SAME(tpu_pjrt_event_on_ready_args, callback, PJRT_Event_OnReady_Args, callback);
  SAME(tpu_pjrt_event_on_ready_args, user_arg, PJRT_Event_OnReady_Args, user_arg);
  SIZE(tpu_pjrt_event_on_ready_args, user_arg, PJRT_Event_OnReady_Args);

  /* named values and their type tags */
  HEAD(tpu_pjrt_named_value, PJRT_NamedValue);
  SAME(tpu_pjrt_named_value, name, PJRT_NamedValue, name);
  SAME(tpu_pjrt_named_value, name_size, PJRT_NamedValue, name_size);
  SAME(tpu_pjrt_named_value, type, PJRT_NamedValue, type);
  SAME(tpu_pjrt_named_value, string_value, PJRT_NamedValue, string_value);
  SAME(tpu_pjrt_named_value, int64_value, PJRT_NamedValue, int64_value);
  SAME(tpu_pjrt_named_value, int64_array_value, PJRT_NamedValue, int64_array_value);
  SAME(tpu_pjrt_named_value, float_value, PJRT_NamedValue, float_value);
  SAME(tpu_pjrt_named_value, bool_value, PJRT_NamedValue, bool_value);
  SAME(tpu_pjrt_named_value, value_size, PJRT_NamedValue, value_size);
  SIZE(tpu_pjrt_named_value, value_size, PJRT_NamedValue);
  ENUM(TPU_PJRT_NV_STRING, PJRT_NamedValue_kString);
  ENUM(TPU_PJRT_NV_INT64, PJRT_NamedValue_kInt64);
  ENUM(TPU_PJRT_NV_INT64_LIST, PJRT_NamedValue_kInt64List);
  ENUM(TPU_PJRT_NV_FLOAT, PJRT_NamedValue_kFloat);
  ENUM(TPU_PJRT_NV_BOOL, PJRT_NamedValue_kBool);

  /* client */
  HEAD(tpu_pjrt_client_create_args, PJRT_Client_Create_Args);
  SAME(tpu_pjrt_client_create_args, create_options, PJRT_Client_Create_Args, create_options);
  SAME(tpu_pjrt_client_create_args, num_options, PJRT_Client_Create_Args, num_options);
  SAME(tpu_pjrt_client_create_args, kv_get_callback, PJRT_Client_Create_Args, kv_get_callback);
  SAME(tpu_pjrt_client_create_args, kv_get_user_arg, PJRT_Client_Create_Args, kv_get_user_arg);
  SAME(tpu_pjrt_client_create_args, kv_put_callback, PJRT_Client_Create_Args, kv_put_callback);
  SAME(tpu_pjrt_client_create_args, kv_put_user_arg, PJRT_Client_Create_Args, kv_put_user_arg);
  SAME(tpu_pjrt_client_create_args, client, PJRT_Client_Create_Args, client);
  SAME(tpu_pjrt_client_create_args, kv_try_get_callback, PJRT_Client_Create_Args, kv_try_get_callback);
  SAME(tpu_pjrt_client_create_args, kv_try_get_user_arg, PJRT_Client_Create_Args, kv_try_get_user_arg);
  SIZE(tpu_pjrt_client_create_args, kv_try_get_user_arg, PJRT_Client_Create_Args);

  HEAD(tpu_pjrt_client_destroy_args, PJRT_Client_Destroy_Args);
  SAME(tpu_pjrt_client_destroy_args, client, PJRT_Client_Destroy_Args, client);
  SIZE(tpu_pjrt_client_destroy_args, client, PJRT_Client_Destroy_Args);

  HEAD(tpu_pjrt_client_string_args, PJRT_Client_PlatformName_Args);
  SAME(tpu_pjrt_client_string_args, client, PJRT_Client_PlatformName_Args, client);
  SAME(tpu_pjrt_client_string_args, str, PJRT_Client_PlatformName_Args, platform_name);
  SAME(tpu_pjrt_client_string_args, size, PJRT_Client_PlatformName_Args, platform_name_size);
  SIZE(tpu_pjrt_client_string_args, size, PJRT_Client_PlatformName_Args);
  HEAD(tpu_pjrt_client_string_args, PJRT_Client_PlatformVersion_Args);
  SAME(tpu_pjrt_client_string_args, client, PJRT_Client_PlatformVersion_Args, client);
  SAME(tpu_pjrt_client_string_args, str, PJRT_Client_PlatformVersion_Args, platform_version);
  SAME(tpu_pjrt_client_string_args, size, PJRT_Client_PlatformVersion_Args, platform_version_size);
  SIZE(tpu_pjrt_client_string_args, size, PJRT_Client_PlatformVersion_Args);

  HEAD(tpu_pjrt_client_devices_args, PJRT_Client_AddressableDevices_Args);
  SAME(tpu_pjrt_client_devices_args, client, PJRT_Client_AddressableDevices_Args, client);
  SAME(tpu_pjrt_client_devices_args, devices, PJRT_Client_AddressableDevices_Args, addressable_devices);
  SAME(tpu_pjrt_client_devices_args, num_devices, PJRT_Client_AddressableDevices_Args, num_addressable_devices);
  SIZE(tpu_pjrt_client_devices_args, num_devices, PJRT_Client_AddressableDevices_Args);
  HEAD(tpu_pjrt_copy_to_device_args, PJRT_Buffer_CopyToDevice_Args);
  SAME(tpu_pjrt_copy_to_device_args, buffer, PJRT_Buffer_CopyToDevice_Args, buffer);
  SAME(tpu_pjrt_copy_to_device_args, dst_device, PJRT_Buffer_CopyToDevice_Args, dst_device);
  SAME(tpu_pjrt_copy_to_device_args, dst_buffer, PJRT_Buffer_CopyToDevice_Args, dst_buffer);
  SIZE(tpu_pjrt_copy_to_device_args, dst_buffer, PJRT_Buffer_CopyToDevice_Args);
  HEAD(tpu_pjrt_is_on_cpu_args, PJRT_Buffer_IsOnCpu_Args);
  SAME(tpu_pjrt_is_on_cpu_args, buffer, PJRT_Buffer_IsOnCpu_Args, buffer);
  SAME(tpu_pjrt_is_on_cpu_args, is_on_cpu, PJRT_Buffer_IsOnCpu_Args, is_on_cpu);
  SIZE(tpu_pjrt_is_on_cpu_args, is_on_cpu, PJRT_Buffer_IsOnCpu_Args);
  HEAD(tpu_pjrt_ready_event_args, PJRT_Buffer_ReadyEvent_Args);
  SAME(tpu_pjrt_ready_event_args, buffer, PJRT_Buffer_ReadyEvent_Args, buffer);
  SAME(tpu_pjrt_ready_event_args, event, PJRT_Buffer_ReadyEvent_Args, event);
  SIZE(tpu_pjrt_ready_event_args, event, PJRT_Buffer_ReadyEvent_Args);
  HEAD(tpu_pjrt_unsafe_pointer_args, PJRT_Buffer_UnsafePointer_Args);
  SAME(tpu_pjrt_unsafe_pointer_args, buffer, PJRT_Buffer_UnsafePointer_Args, buffer);
  SAME(tpu_pjrt_unsafe_pointer_args, buffer_pointer, PJRT_Buffer_UnsafePointer_Args, buffer_pointer);
  SIZE(tpu_pjrt_unsafe_pointer_args, buffer_pointer, PJRT_Buffer_UnsafePointer_Args);
  HEAD(tpu_pjrt_exec_devices_args, PJRT_LoadedExecutable_AddressableDevices_Args);
  SAME(tpu_pjrt_exec_devices_args, executable, PJRT_LoadedExecutable_AddressableDevices_Args, executable);
  SAME(tpu_pjrt_exec_devices_args, devices, PJRT_LoadedExecutable_AddressableDevices_Args, addressable_devices);
  SAME(tpu_pjrt_exec_devices_args, num_devices, PJRT_LoadedExecutable_AddressableDevices_Args, num_addressable_devices);
  SIZE(tpu_pjrt_exec_devices_args, num_devices, PJRT_LoadedExecutable_AddressableDevices_Args);

  /* compile */
  HEAD(tpu_pjrt_program, PJRT_Program);
  SAME(tpu_pjrt_program, code, PJRT_Program, code);
  SAME(tpu_pjrt_program, code_size, PJRT_Program, code_size);
  SAME(tpu_pjrt_program, format, PJRT_Program, format);
  SAME(tpu_pjrt_program, format_size, PJRT_Program, format_size);
  SIZE(tpu_pjrt_program, format_size, PJRT_Program);

  HEAD(tpu_pjrt_compile_args, PJRT_Client_Compile_Args);
  SAME(tpu_pjrt_compile_args, client, PJRT_Client_Compile_Args, client);
  SAME(tpu_pjrt_compile_args, program, PJRT_Client_Compile_Args, program);
  SAME(tpu_pjrt_compile_args, compile_options, PJRT_Client_Compile_Args, compile_options);
  SAME(tpu_pjrt_compile_args, compile_options_size, PJRT_Client_Compile_Args, compile_options_size);
  SAME(tpu_pjrt_compile_args, executable, PJRT_Client_Compile_Args, executable);
  SIZE(tpu_pjrt_compile_args, executable, PJRT_Client_Compile_Args);

  /* host to device */
  HEAD(tpu_pjrt_from_host_args, PJRT_Client_BufferFromHostBuffer_Args);
  SAME(tpu_pjrt_from_host_args, client, PJRT_Client_BufferFromHostBuffer_Args, client);
  SAME(tpu_pjrt_from_host_args, data, PJRT_Client_BufferFromHostBuffer_Args, data);
  SAME(tpu_pjrt_from_host_args, type, PJRT_Client_BufferFromHostBuffer_Args, type);
  SAME(tpu_pjrt_from_host_args, dims, PJRT_Client_BufferFromHostBuffer_Args, dims);
  SAME(tpu_pjrt_from_host_args, num_dims, PJRT_Client_BufferFromHostBuffer_Args, num_dims);
  SAME(tpu_pjrt_from_host_args, byte_strides, PJRT_Client_BufferFromHostBuffer_Args, byte_strides);
  SAME(tpu_pjrt_from_host_args, num_byte_strides, PJRT_Client_BufferFromHostBuffer_Args, num_byte_strides);
  SAME(tpu_pjrt_from_host_args, host_buffer_semantics, PJRT_Client_BufferFromHostBuffer_Args, host_buffer_semantics);
  SAME(tpu_pjrt_from_host_args, device, PJRT_Client_BufferFromHostBuffer_Args, device);
  SAME(tpu_pjrt_from_host_args, memory, PJRT_Client_BufferFromHostBuffer_Args, memory);
  SAME(tpu_pjrt_from_host_args, device_layout, PJRT_Client_BufferFromHostBuffer_Args, device_layout);
  SAME(tpu_pjrt_from_host_args, done_with_host_buffer, PJRT_Client_BufferFromHostBuffer_Args, done_with_host_buffer);
  SAME(tpu_pjrt_from_host_args, buffer, PJRT_Client_BufferFromHostBuffer_Args, buffer);
  SIZE(tpu_pjrt_from_host_args, buffer, PJRT_Client_BufferFromHostBuffer_Args);
  ENUM(TPU_PJRT_HOST_IMMUTABLE_ONLY_DURING_CALL, PJRT_HostBufferSemantics_kImmutableOnlyDuringCall);
  ENUM(TPU_PJRT_HOST_IMMUTABLE_UNTIL_TRANSFER_COMPLETES, PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes);

  /* element types: tpu_dtype values are PJRT_Buffer_Type values */
  ENUM(TPU_INVALID, PJRT_Buffer_Type_INVALID);
  ENUM(TPU_PRED, PJRT_Buffer_Type_PRED);
  ENUM(TPU_S8, PJRT_Buffer_Type_S8);
  ENUM(TPU_S16, PJRT_Buffer_Type_S16);
  ENUM(TPU_S32, PJRT_Buffer_Type_S32);
  ENUM(TPU_S64, PJRT_Buffer_Type_S64);
  ENUM(TPU_U8, PJRT_Buffer_Type_U8);
  ENUM(TPU_U16, PJRT_Buffer_Type_U16);
  ENUM(TPU_U32, PJRT_Buffer_Type_U32);
  ENUM(TPU_U64, PJRT_Buffer_Type_U64);
  ENUM(TPU_F16, PJRT_Buffer_Type_F16);
  ENUM(TPU_F32, PJRT_Buffer_Type_F32);
  ENUM(TPU_F64, PJRT_Buffer_Type_F64);
  ENUM(TPU_BF16, PJRT_Buffer_Type_BF16);
  ENUM(TPU_C64, PJRT_Buffer_Type_C64);
  ENUM(TPU_C128, PJRT_Buffer_Type_C128);

  /* devices */
  HEAD(tpu_pjrt_device_desc_args, PJRT_Device_GetDescription_Args);
  SAME(tpu_pjrt_device_desc_args, device, PJRT_Device_GetDescription_Args, device);
  SAME(tpu_pjrt_device_desc_args, desc, PJRT_Device_GetDescription_Args, device_description);
  SIZE(tpu_pjrt_device_desc_args, desc, PJRT_Device_GetDescription_Args);

  HEAD(tpu_pjrt_desc_kind_args, PJRT_DeviceDescription_Kind_Args);
  SAME(tpu_pjrt_desc_kind_args, desc, PJRT_DeviceDescription_Kind_Args, device_description);
  SAME(tpu_pjrt_desc_kind_args, kind, PJRT_DeviceDescription_Kind_Args, device_kind);
  SAME(tpu_pjrt_desc_kind_args, kind_size, PJRT_DeviceDescription_Kind_Args, device_kind_size);
  SIZE(tpu_pjrt_desc_kind_args, kind_size, PJRT_DeviceDescription_Kind_Args);

  /* memory statistics */
#define MS(f) SAME(tpu_pjrt_memory_stats_args, f, PJRT_Device_MemoryStats_Args, f)
  HEAD(tpu_pjrt_memory_stats_args, PJRT_Device_MemoryStats_Args);
  MS(device);
  MS(bytes_in_use);
  MS(peak_bytes_in_use);
  MS(peak_bytes_in_use_is_set);
  MS(num_allocs);
  MS(num_allocs_is_set);
  MS(largest_alloc_size);
  MS(largest_alloc_size_is_set);
  MS(bytes_limit);
  MS(bytes_limit_is_set);
  MS(bytes_reserved);
  MS(bytes_reserved_is_set);
  MS(peak_bytes_reserved);
  MS(peak_bytes_reserved_is_set);
  MS(bytes_reservable_limit);
  MS(bytes_reservable_limit_is_set);
  MS(largest_free_block_bytes);
  MS(largest_free_block_bytes_is_set);
  MS(pool_bytes);
  MS(pool_bytes_is_set);
  MS(peak_pool_bytes);
  MS(peak_pool_bytes_is_set);
#undef MS
  SIZE(tpu_pjrt_memory_stats_args, peak_pool_bytes_is_set, PJRT_Device_MemoryStats_Args);

  /* executables */
  HEAD(tpu_pjrt_exec_destroy_args, PJRT_Executable_Destroy_Args);
  SAME(tpu_pjrt_exec_destroy_args, executable, PJRT_Executable_Destroy_Args, executable);
  SIZE(tpu_pjrt_exec_destroy_args, executable, PJRT_Executable_Destroy_Args);

  HEAD(tpu_pjrt_num_outputs_args, PJRT_Executable_NumOutputs_Args);
  SAME(tpu_pjrt_num_outputs_args, executable, PJRT_Executable_NumOutputs_Args, executable);
  SAME(tpu_pjrt_num_outputs_args, num_outputs, PJRT_Executable_NumOutputs_Args, num_outputs);
  SIZE(tpu_pjrt_num_outputs_args, num_outputs, PJRT_Executable_NumOutputs_Args);

  HEAD(tpu_pjrt_serialize_args, PJRT_Executable_Serialize_Args);
  SAME(tpu_pjrt_serialize_args, executable, PJRT_Executable_Serialize_Args, executable);
  SAME(tpu_pjrt_serialize_args, bytes, PJRT_Executable_Serialize_Args, serialized_bytes);
  SAME(tpu_pjrt_serialize_args, bytes_size, PJRT_Executable_Serialize_Args, serialized_bytes_size);
  SAME(tpu_pjrt_serialize_args, serialized, PJRT_Executable_Serialize_Args, serialized_executable);
  SAME(tpu_pjrt_serialize_args, deleter, PJRT_Executable_Serialize_Args, serialized_executable_deleter);
  SIZE(tpu_pjrt_serialize_args, deleter, PJRT_Executable_Serialize_Args);

  HEAD(tpu_pjrt_loaded_destroy_args, PJRT_LoadedExecutable_Destroy_Args);
  SAME(tpu_pjrt_loaded_destroy_args, executable, PJRT_LoadedExecutable_Destroy_Args, executable);
  SIZE(tpu_pjrt_loaded_destroy_args, executable, PJRT_LoadedExecutable_Destroy_Args);

  HEAD(tpu_pjrt_get_exec_args, PJRT_LoadedExecutable_GetExecutable_Args);
  SAME(tpu_pjrt_get_exec_args, loaded, PJRT_LoadedExecutable_GetExecutable_Args, loaded_executable);
  SAME(tpu_pjrt_get_exec_args, executable, PJRT_LoadedExecutable_GetExecutable_Args, executable);
  SIZE(tpu_pjrt_get_exec_args, executable, PJRT_LoadedExecutable_GetExecutable_Args);
  HEAD(tpu_pjrt_optimized_args, PJRT_Executable_OptimizedProgram_Args);
  SAME(tpu_pjrt_optimized_args, executable, PJRT_Executable_OptimizedProgram_Args, executable);
  SAME(tpu_pjrt_optimized_args, program, PJRT_Executable_OptimizedProgram_Args, program);
  SIZE(tpu_pjrt_optimized_args, program, PJRT_Executable_OptimizedProgram_Args);

  HEAD(tpu_pjrt_execute_options, PJRT_ExecuteOptions);
  SAME(tpu_pjrt_execute_options, send_callbacks, PJRT_ExecuteOptions, send_callbacks);
  SAME(tpu_pjrt_execute_options, recv_callbacks, PJRT_ExecuteOptions, recv_callbacks);
  SAME(tpu_pjrt_execute_options, num_send_ops, PJRT_ExecuteOptions, num_send_ops);
  SAME(tpu_pjrt_execute_options, num_recv_ops, PJRT_ExecuteOptions, num_recv_ops);
  SAME(tpu_pjrt_execute_options, launch_id, PJRT_ExecuteOptions, launch_id);
  SAME(tpu_pjrt_execute_options, non_donatable_input_indices, PJRT_ExecuteOptions, non_donatable_input_indices);
  SAME(tpu_pjrt_execute_options, num_non_donatable_input_indices, PJRT_ExecuteOptions, num_non_donatable_input_indices);
  SAME(tpu_pjrt_execute_options, context, PJRT_ExecuteOptions, context);
  SAME(tpu_pjrt_execute_options, call_location, PJRT_ExecuteOptions, call_location);
  SAME(tpu_pjrt_execute_options, num_tasks, PJRT_ExecuteOptions, num_tasks);
  SAME(tpu_pjrt_execute_options, task_ids, PJRT_ExecuteOptions, task_ids);
  SAME(tpu_pjrt_execute_options, incarnation_ids, PJRT_ExecuteOptions, incarnation_ids);
  /* multi_slice_config is newer than 0.81: checked only where the header has it. */
#if PJRT_API_MINOR >= 104
  SAME(tpu_pjrt_execute_options, multi_slice_config, PJRT_ExecuteOptions, multi_slice_config);
  SIZE(tpu_pjrt_execute_options, multi_slice_config, PJRT_ExecuteOptions);
#else
  CHECK(offsetof(tpu_pjrt_execute_options, multi_slice_config) == (size_t)PJRT_ExecuteOptions_STRUCT_SIZE,
        "multi_slice_config at %zu, not right after upstream's last field (%zu)",
        offsetof(tpu_pjrt_execute_options, multi_slice_config), (size_t)PJRT_ExecuteOptions_STRUCT_SIZE);
  report_longer("tpu_pjrt_execute_options", TPU_PJRT_SIZE(tpu_pjrt_execute_options, multi_slice_config),
                "PJRT_ExecuteOptions", PJRT_ExecuteOptions_STRUCT_SIZE, "multi_slice_config, appended in 0.104");
#endif

  HEAD(tpu_pjrt_execute_args, PJRT_LoadedExecutable_Execute_Args);
  SAME(tpu_pjrt_execute_args, executable, PJRT_LoadedExecutable_Execute_Args, executable);
  SAME(tpu_pjrt_execute_args, options, PJRT_LoadedExecutable_Execute_Args, options);
  SAME(tpu_pjrt_execute_args, argument_lists, PJRT_LoadedExecutable_Execute_Args, argument_lists);
  SAME(tpu_pjrt_execute_args, num_devices, PJRT_LoadedExecutable_Execute_Args, num_devices);
  SAME(tpu_pjrt_execute_args, num_args, PJRT_LoadedExecutable_Execute_Args, num_args);
  SAME(tpu_pjrt_execute_args, output_lists, PJRT_LoadedExecutable_Execute_Args, output_lists);
  SAME(tpu_pjrt_execute_args, device_complete_events, PJRT_LoadedExecutable_Execute_Args, device_complete_events);
  SAME(tpu_pjrt_execute_args, execute_device, PJRT_LoadedExecutable_Execute_Args, execute_device);
  SIZE(tpu_pjrt_execute_args, execute_device, PJRT_LoadedExecutable_Execute_Args);

  HEAD(tpu_pjrt_deserialize_args, PJRT_Executable_DeserializeAndLoad_Args);
  SAME(tpu_pjrt_deserialize_args, client, PJRT_Executable_DeserializeAndLoad_Args, client);
  SAME(tpu_pjrt_deserialize_args, serialized, PJRT_Executable_DeserializeAndLoad_Args, serialized_executable);
  SAME(tpu_pjrt_deserialize_args, serialized_size, PJRT_Executable_DeserializeAndLoad_Args, serialized_executable_size);
  SAME(tpu_pjrt_deserialize_args, loaded, PJRT_Executable_DeserializeAndLoad_Args, loaded_executable);
  SAME(tpu_pjrt_deserialize_args, overridden_compile_options, PJRT_Executable_DeserializeAndLoad_Args,
       overridden_serialized_compile_options);
  SAME(tpu_pjrt_deserialize_args, overridden_compile_options_size, PJRT_Executable_DeserializeAndLoad_Args,
       overridden_serialized_compile_options_size);
  SIZE(tpu_pjrt_deserialize_args, overridden_compile_options_size, PJRT_Executable_DeserializeAndLoad_Args);

  /* buffers */
  HEAD(tpu_pjrt_buffer_destroy_args, PJRT_Buffer_Destroy_Args);
  SAME(tpu_pjrt_buffer_destroy_args, buffer, PJRT_Buffer_Destroy_Args, buffer);
  SIZE(tpu_pjrt_buffer_destroy_args, buffer, PJRT_Buffer_Destroy_Args);

  HEAD(tpu_pjrt_element_type_args, PJRT_Buffer_ElementType_Args);
  SAME(tpu_pjrt_element_type_args, buffer, PJRT_Buffer_ElementType_Args, buffer);
  SAME(tpu_pjrt_element_type_args, type, PJRT_Buffer_ElementType_Args, type);
  SIZE(tpu_pjrt_element_type_args, type, PJRT_Buffer_ElementType_Args);

  HEAD(tpu_pjrt_dimensions_args, PJRT_Buffer_Dimensions_Args);
  SAME(tpu_pjrt_dimensions_args, buffer, PJRT_Buffer_Dimensions_Args, buffer);
  SAME(tpu_pjrt_dimensions_args, dims, PJRT_Buffer_Dimensions_Args, dims);
  SAME(tpu_pjrt_dimensions_args, num_dims, PJRT_Buffer_Dimensions_Args, num_dims);
  SIZE(tpu_pjrt_dimensions_args, num_dims, PJRT_Buffer_Dimensions_Args);

  /* layouts */
  HEAD(tpu_pjrt_layout_tiled, PJRT_Buffer_MemoryLayout_Tiled);
  SAME(tpu_pjrt_layout_tiled, minor_to_major, PJRT_Buffer_MemoryLayout_Tiled, minor_to_major);
  SAME(tpu_pjrt_layout_tiled, minor_to_major_size, PJRT_Buffer_MemoryLayout_Tiled, minor_to_major_size);
  SAME(tpu_pjrt_layout_tiled, tile_dims, PJRT_Buffer_MemoryLayout_Tiled, tile_dims);
  SAME(tpu_pjrt_layout_tiled, tile_dim_sizes, PJRT_Buffer_MemoryLayout_Tiled, tile_dim_sizes);
  SAME(tpu_pjrt_layout_tiled, num_tiles, PJRT_Buffer_MemoryLayout_Tiled, num_tiles);
  SIZE(tpu_pjrt_layout_tiled, num_tiles, PJRT_Buffer_MemoryLayout_Tiled);
  HEAD(tpu_pjrt_layout_strides, PJRT_Buffer_MemoryLayout_Strides);
  SAME(tpu_pjrt_layout_strides, byte_strides, PJRT_Buffer_MemoryLayout_Strides, byte_strides);
  SAME(tpu_pjrt_layout_strides, num_byte_strides, PJRT_Buffer_MemoryLayout_Strides, num_byte_strides);
  SIZE(tpu_pjrt_layout_strides, num_byte_strides, PJRT_Buffer_MemoryLayout_Strides);
  HEAD(tpu_pjrt_layout, PJRT_Buffer_MemoryLayout);
  SAME(tpu_pjrt_layout, tiled, PJRT_Buffer_MemoryLayout, tiled);
  SAME(tpu_pjrt_layout, strides, PJRT_Buffer_MemoryLayout, strides);
  SAME(tpu_pjrt_layout, type, PJRT_Buffer_MemoryLayout, type);
  SIZE(tpu_pjrt_layout, type, PJRT_Buffer_MemoryLayout);
  ENUM(TPU_PJRT_LAYOUT_TILED, PJRT_Buffer_MemoryLayout_Type_Tiled);
  ENUM(TPU_PJRT_LAYOUT_STRIDES, PJRT_Buffer_MemoryLayout_Type_Strides);

  /* error codes */
  ENUM(TPU_PJRT_INVALID_ARGUMENT, PJRT_Error_Code_INVALID_ARGUMENT);
  ENUM(TPU_PJRT_RESOURCE_EXHAUSTED, PJRT_Error_Code_RESOURCE_EXHAUSTED);
  ENUM(TPU_PJRT_UNIMPLEMENTED, PJRT_Error_Code_UNIMPLEMENTED);

  HEAD(tpu_pjrt_to_host_args, PJRT_Buffer_ToHostBuffer_Args);
  SAME(tpu_pjrt_to_host_args, src, PJRT_Buffer_ToHostBuffer_Args, src);
  SAME(tpu_pjrt_to_host_args, host_layout, PJRT_Buffer_ToHostBuffer_Args, host_layout);
  SAME(tpu_pjrt_to_host_args, dst, PJRT_Buffer_ToHostBuffer_Args, dst);
  SAME(tpu_pjrt_to_host_args, dst_size, PJRT_Buffer_ToHostBuffer_Args, dst_size);
  SAME(tpu_pjrt_to_host_args, event, PJRT_Buffer_ToHostBuffer_Args, event);
  SIZE(tpu_pjrt_to_host_args, event, PJRT_Buffer_ToHostBuffer_Args);

  /* compiling for a topology without a client (aot.c) */
  HEAD(tpu_pjrt_topology_create_args, PJRT_TopologyDescription_Create_Args);
  SAME(tpu_pjrt_topology_create_args, topology_name, PJRT_TopologyDescription_Create_Args, topology_name);
  SAME(tpu_pjrt_topology_create_args, topology_name_size, PJRT_TopologyDescription_Create_Args, topology_name_size);
  SAME(tpu_pjrt_topology_create_args, create_options, PJRT_TopologyDescription_Create_Args, create_options);
  SAME(tpu_pjrt_topology_create_args, num_options, PJRT_TopologyDescription_Create_Args, num_options);
  SAME(tpu_pjrt_topology_create_args, topology, PJRT_TopologyDescription_Create_Args, topology);
  SIZE(tpu_pjrt_topology_create_args, topology, PJRT_TopologyDescription_Create_Args);
  HEAD(tpu_pjrt_topology_destroy_args, PJRT_TopologyDescription_Destroy_Args);
  SAME(tpu_pjrt_topology_destroy_args, topology, PJRT_TopologyDescription_Destroy_Args, topology);
  SIZE(tpu_pjrt_topology_destroy_args, topology, PJRT_TopologyDescription_Destroy_Args);
  HEAD(tpu_pjrt_topology_string_args, PJRT_TopologyDescription_PlatformVersion_Args);
  SAME(tpu_pjrt_topology_string_args, topology, PJRT_TopologyDescription_PlatformVersion_Args, topology);
  SAME(tpu_pjrt_topology_string_args, str, PJRT_TopologyDescription_PlatformVersion_Args, platform_version);
  SAME(tpu_pjrt_topology_string_args, size, PJRT_TopologyDescription_PlatformVersion_Args, platform_version_size);
  SIZE(tpu_pjrt_topology_string_args, size, PJRT_TopologyDescription_PlatformVersion_Args);
  HEAD(tpu_pjrt_topology_string_args, PJRT_TopologyDescription_PlatformName_Args);
  SAME(tpu_pjrt_topology_string_args, topology, PJRT_TopologyDescription_PlatformName_Args, topology);
  SAME(tpu_pjrt_topology_string_args, str, PJRT_TopologyDescription_PlatformName_Args, platform_name);
  SAME(tpu_pjrt_topology_string_args, size, PJRT_TopologyDescription_PlatformName_Args, platform_name_size);
  SIZE(tpu_pjrt_topology_string_args, size, PJRT_TopologyDescription_PlatformName_Args);
  HEAD(tpu_pjrt_topology_devices_args, PJRT_TopologyDescription_GetDeviceDescriptions_Args);
  SAME(tpu_pjrt_topology_devices_args, topology, PJRT_TopologyDescription_GetDeviceDescriptions_Args, topology);
  SAME(tpu_pjrt_topology_devices_args, descriptions, PJRT_TopologyDescription_GetDeviceDescriptions_Args, descriptions);
  SAME(tpu_pjrt_topology_devices_args, num_descriptions, PJRT_TopologyDescription_GetDeviceDescriptions_Args,
       num_descriptions);
  SIZE(tpu_pjrt_topology_devices_args, num_descriptions, PJRT_TopologyDescription_GetDeviceDescriptions_Args);
  HEAD(tpu_pjrt_desc_attributes_args, PJRT_DeviceDescription_Attributes_Args);
  SAME(tpu_pjrt_desc_attributes_args, desc, PJRT_DeviceDescription_Attributes_Args, device_description);
  SAME(tpu_pjrt_desc_attributes_args, num_attributes, PJRT_DeviceDescription_Attributes_Args, num_attributes);
  SAME(tpu_pjrt_desc_attributes_args, attributes, PJRT_DeviceDescription_Attributes_Args, attributes);
  SIZE(tpu_pjrt_desc_attributes_args, attributes, PJRT_DeviceDescription_Attributes_Args);
  HEAD(tpu_pjrt_topology_compile_args, PJRT_Compile_Args);
  SAME(tpu_pjrt_topology_compile_args, topology, PJRT_Compile_Args, topology);
  SAME(tpu_pjrt_topology_compile_args, program, PJRT_Compile_Args, program);
  SAME(tpu_pjrt_topology_compile_args, compile_options, PJRT_Compile_Args, compile_options);
  SAME(tpu_pjrt_topology_compile_args, compile_options_size, PJRT_Compile_Args, compile_options_size);
  SAME(tpu_pjrt_topology_compile_args, client, PJRT_Compile_Args, client);
  SAME(tpu_pjrt_topology_compile_args, executable, PJRT_Compile_Args, executable);
  SIZE(tpu_pjrt_topology_compile_args, executable, PJRT_Compile_Args);
  HEAD(tpu_pjrt_num_partitions_args, PJRT_Executable_NumPartitions_Args);
  SAME(tpu_pjrt_num_partitions_args, executable, PJRT_Executable_NumPartitions_Args, executable);
  SAME(tpu_pjrt_num_partitions_args, num_partitions, PJRT_Executable_NumPartitions_Args, num_partitions);
  SIZE(tpu_pjrt_num_partitions_args, num_partitions, PJRT_Executable_NumPartitions_Args);
  HEAD(tpu_pjrt_cost_args, PJRT_Executable_GetCostAnalysis_Args);
  SAME(tpu_pjrt_cost_args, executable, PJRT_Executable_GetCostAnalysis_Args, executable);
  SAME(tpu_pjrt_cost_args, num_properties, PJRT_Executable_GetCostAnalysis_Args, num_properties);
  SAME(tpu_pjrt_cost_args, properties, PJRT_Executable_GetCostAnalysis_Args, properties);
  SIZE(tpu_pjrt_cost_args, properties, PJRT_Executable_GetCostAnalysis_Args);
  HEAD(tpu_pjrt_fingerprint_args, PJRT_Executable_Fingerprint_Args);
  SAME(tpu_pjrt_fingerprint_args, executable, PJRT_Executable_Fingerprint_Args, executable);
  SAME(tpu_pjrt_fingerprint_args, fingerprint, PJRT_Executable_Fingerprint_Args, executable_fingerprint);
  SAME(tpu_pjrt_fingerprint_args, fingerprint_size, PJRT_Executable_Fingerprint_Args, executable_fingerprint_size);
  SIZE(tpu_pjrt_fingerprint_args, fingerprint_size, PJRT_Executable_Fingerprint_Args);
#define MEM(f) SAME(tpu_pjrt_memory_args, f, PJRT_Executable_GetCompiledMemoryStats_Args, f)
  HEAD(tpu_pjrt_memory_args, PJRT_Executable_GetCompiledMemoryStats_Args);
  MEM(executable);
  MEM(generated_code_size_in_bytes);
  MEM(argument_size_in_bytes);
  MEM(output_size_in_bytes);
  MEM(alias_size_in_bytes);
  MEM(temp_size_in_bytes);
  MEM(host_generated_code_size_in_bytes);
  MEM(host_argument_size_in_bytes);
  MEM(host_output_size_in_bytes);
  MEM(host_alias_size_in_bytes);
  MEM(host_temp_size_in_bytes);
  MEM(peak_memory_in_bytes);
#undef MEM
  SIZE(tpu_pjrt_memory_args, peak_memory_in_bytes, PJRT_Executable_GetCompiledMemoryStats_Args);
}

/* The function table: our entries are a prefix of upstream's, in order. */
static void test_table(void) {
  HEAD(tpu_pjrt_api, PJRT_Api);
  SAME(tpu_pjrt_api, pjrt_api_version, PJRT_Api, pjrt_api_version);
  int n = 0;
#define TPU_ENTRY(name)                            \
  SAME(tpu_pjrt_api, name, PJRT_Api, PJRT_##name); \
  n++;
  TPU_PJRT_ENTRIES(TPU_ENTRY)
#undef TPU_ENTRY
  CHECK(sizeof(tpu_pjrt_api) <= (size_t)PJRT_Api_STRUCT_SIZE, "our table (%zu bytes) is longer than upstream's (%zu)",
        sizeof(tpu_pjrt_api), (size_t)PJRT_Api_STRUCT_SIZE);
  printf("note: tpu_pjrt_api declares %d entries (%zu bytes) of upstream's %zu-byte table (PJRT C API %d.%d header)\n",
         n, sizeof(tpu_pjrt_api), (size_t)PJRT_Api_STRUCT_SIZE, PJRT_API_MAJOR, PJRT_API_MINOR);
}

/* The entries runtime.c calls: the required ones (TPU_PJRT_REQUIRED) and
 * the optional ones, which the CPU plugin has too. All must be inside the
 * plugin's table and non-NULL. */
#define TPU_OPTIONAL(X) \
  X(Plugin_Initialize) X(Device_MemoryStats) X(Executable_Serialize) X(Executable_DeserializeAndLoad)
#define TPU_USED(X) TPU_PJRT_REQUIRED(X) TPU_OPTIONAL(X)

static void test_plugin(const char *path) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  CHECK(h != NULL, "dlopen %s: %s", path, dlerror());
  if (!h) return;
  tpu_pjrt_get_api_fn get = (tpu_pjrt_get_api_fn)dlsym(h, "GetPjrtApi");
  CHECK(get != NULL, "%s exports no GetPjrtApi", path);
  const tpu_pjrt_api *api = get ? get() : NULL;
  CHECK(api != NULL, "GetPjrtApi returned NULL");
  if (!api) return;
  const PJRT_Api *theirs = (const PJRT_Api *)(const void *)api;
  CHECK(api->pjrt_api_version.major_version == 0 && api->pjrt_api_version.minor_version >= TPU_RT_MIN_API_MINOR,
        "plugin API %d.%d", api->pjrt_api_version.major_version, api->pjrt_api_version.minor_version);
  CHECK(theirs->pjrt_api_version.minor_version == api->pjrt_api_version.minor_version, "version read two ways");
  if (api->pjrt_api_version.major_version != PJRT_API_MAJOR || api->pjrt_api_version.minor_version != PJRT_API_MINOR)
    printf("note: the plugin implements %d.%d, the wheel's header says %d.%d\n", api->pjrt_api_version.major_version,
           api->pjrt_api_version.minor_version, PJRT_API_MAJOR, PJRT_API_MINOR);
  CHECK(api->struct_size >= sizeof(tpu_pjrt_api), "plugin table is %zu bytes, ours %zu", api->struct_size,
        sizeof(tpu_pjrt_api));
#define TPU_PRESENT(name)                                                       \
  CHECK(api->struct_size >= offsetof(tpu_pjrt_api, name) + sizeof(tpu_pjrt_fn), \
        "plugin table (%zu bytes) ends "                                        \
        "before " #name " (at %zu)",                                            \
        api->struct_size, offsetof(tpu_pjrt_api, name));                        \
  CHECK(api->name != NULL, "plugin has no " #name);                             \
  CHECK((void *)api->name == (void *)theirs->PJRT_##name, #name " read two ways differs");
  TPU_USED(TPU_PRESENT)
#undef TPU_PRESENT
  printf("plugin %s: PJRT C API %d.%d, table %zu bytes\n", path, api->pjrt_api_version.major_version,
         api->pjrt_api_version.minor_version, api->struct_size);
  /* Never dlclose a plugin: it keeps threads and static state. */
}

int main(int argc, char **argv) {
  test_structs();
  test_table();
  if (argc > 1)
    test_plugin(argv[1]);
  else
    CHECK(0, "usage: %s PJRT_PLUGIN.so", argv[0]);
  if (!longer) printf("note: every struct we declare matches this header's size exactly\n");
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
