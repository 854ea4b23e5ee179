// RUN: stageml-opt %s -p bt-annotate,bt-propagate,bt-improve --stage 'fc.weight=static' --stage '*lora_*=adapter' --stage 'p=static' --stage 'q=static' | filecheck %s
// RUN: stageml-opt %s -p bt-annotate,bt-propagate,bt-improve --stage 'fc.weight=static' --stage '*lora_*=adapter' --stage 'p=static' --stage 'q=static' --no-lora-merge | filecheck %s --check-prefix=NOMERGE

// Three request-time linear forms in x (%arg5):
//   %7  = x @ W^T + 2 * ((x @ A^T) @ B^T)   LoRA: merged into one x @ M, M built at adapter time
//   %9  = (x @ A^T) @ B^T                   a low-rank pair alone: x @ (A^T B^T) would cost more, kept
//   %11 = (x @ P) @ Q                       a wide chain: reassociated to x @ (P @ Q), P @ Q static

// CHECK-LABEL: func.func @main
// CHECK:      %[[WT:[0-9]+]] = torch.aten.transpose.int %arg0, %int0, %int1 {bt.time = #bt.time<"static">}
// CHECK-NEXT: %[[AT:[0-9]+]] = torch.aten.transpose.int %arg1, %int0, %int1 {bt.time = #bt.time<"adapter">}
// CHECK-NEXT: %[[BT:[0-9]+]] = torch.aten.transpose.int %arg2, %int0, %int1 {bt.time = #bt.time<"adapter">}
// CHECK-NEXT: %[[AB:[0-9]+]] = torch.aten.mm %[[AT]], %[[BT]] {bt.time = #bt.time<"adapter">} : !torch.vtensor<[8,2],f32>, !torch.vtensor<[2,16],f32> -> !torch.vtensor<[8,16],f32>
// CHECK-NEXT: %[[S:[0-9]+]] = torch.aten.mul.Scalar %[[AB]], %float2.000000e00 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[8,16],f32>, !torch.float -> !torch.vtensor<[8,16],f32>
// CHECK-NEXT: %[[M:[0-9]+]] = torch.aten.add.Tensor %[[WT]], %[[S]], %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[8,16],f32>, !torch.vtensor<[8,16],f32>, !torch.int -> !torch.vtensor<[8,16],f32>
// CHECK-NEXT: %[[Y0:[0-9]+]] = torch.aten.matmul %arg5, %[[M]] {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,16],f32> -> !torch.vtensor<[?,16],f32>
// The low-rank pair is not reassociated: no torch.aten.mm before it.
// CHECK-NEXT: %[[XA:[0-9]+]] = torch.aten.matmul %arg5, %[[AT]] {bt.time = #bt.time<"dynamic">}
// CHECK-NEXT: %[[Y1:[0-9]+]] = torch.aten.matmul %[[XA]], %[[BT]] {bt.time = #bt.time<"dynamic">}
// CHECK-NEXT: %[[PQ:[0-9]+]] = torch.aten.mm %arg3, %arg4 {bt.time = #bt.time<"static">} : !torch.vtensor<[8,16],f32>, !torch.vtensor<[16,4],f32> -> !torch.vtensor<[8,4],f32>
// CHECK-NEXT: %[[Y2:[0-9]+]] = torch.aten.matmul %arg5, %[[PQ]] {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
// CHECK-NEXT: return %[[Y0]], %[[Y1]], %[[Y2]] :
// The factors' request-time products and the original sum are gone.
// CHECK-NOT:  torch.aten.add.Tensor
// CHECK-NOT:  torch.aten.mul.Scalar

// With --no-lora-merge the adapter stays factorized at request time; the
// static-only reassociation still happens.
// NOMERGE-LABEL: func.func @main
// NOMERGE-NOT:   torch.aten.mm
// NOMERGE:       %[[XW:[0-9]+]] = torch.aten.matmul %arg5, %{{[0-9]+}} {bt.time = #bt.time<"dynamic">}
// NOMERGE-NOT:   torch.aten.mm
// NOMERGE:       %[[XA:[0-9]+]] = torch.aten.matmul %arg5, %{{[0-9]+}} {bt.time = #bt.time<"dynamic">}
// NOMERGE-NOT:   torch.aten.mm
// NOMERGE:       %[[XAB:[0-9]+]] = torch.aten.matmul %[[XA]], %{{[0-9]+}} {bt.time = #bt.time<"dynamic">}
// NOMERGE-NEXT:  %[[SC:[0-9]+]] = torch.aten.mul.Scalar %[[XAB]], %float2.000000e00 {bt.time = #bt.time<"dynamic">}
// NOMERGE-NEXT:  %[[Y0:[0-9]+]] = torch.aten.add.Tensor %[[XW]], %[[SC]], %int1 {bt.time = #bt.time<"dynamic">}
// NOMERGE-NOT:   torch.aten.mm %{{[0-9]+}}
// NOMERGE:       %[[PQ:[0-9]+]] = torch.aten.mm %arg3, %arg4 {bt.time = #bt.time<"static">}
// NOMERGE-NEXT:  %[[Y2:[0-9]+]] = torch.aten.matmul %arg5, %[[PQ]] {bt.time = #bt.time<"dynamic">}
// NOMERGE-NEXT:  return %[[Y0]], %{{[0-9]+}}, %[[Y2]] :
func.func @main(%arg0: !torch.vtensor<[16,8],f32> {bt.name = "fc.weight"}, %arg1: !torch.vtensor<[2,8],f32> {bt.name = "fc.lora_A.weight"}, %arg2: !torch.vtensor<[16,2],f32> {bt.name = "fc.lora_B.weight"}, %arg3: !torch.vtensor<[8,16],f32> {bt.name = "p"}, %arg4: !torch.vtensor<[16,4],f32> {bt.name = "q"}, %arg5: !torch.vtensor<[?,8],f32> {bt.name = "x"}) -> (!torch.vtensor<[?,16],f32>, !torch.vtensor<[?,16],f32>, !torch.vtensor<[?,4],f32>) {
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %float = torch.constant.float 2.000000e+00
  %0 = torch.aten.transpose.int %arg0, %int0, %int1 : !torch.vtensor<[16,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,16],f32>
  %1 = torch.aten.matmul %arg5, %0 : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,16],f32> -> !torch.vtensor<[?,16],f32>
  %2 = torch.aten.transpose.int %arg1, %int0, %int1 : !torch.vtensor<[2,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,2],f32>
  %3 = torch.aten.matmul %arg5, %2 : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,2],f32> -> !torch.vtensor<[?,2],f32>
  %4 = torch.aten.transpose.int %arg2, %int0, %int1 : !torch.vtensor<[16,2],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,16],f32>
  %5 = torch.aten.matmul %3, %4 : !torch.vtensor<[?,2],f32>, !torch.vtensor<[2,16],f32> -> !torch.vtensor<[?,16],f32>
  %6 = torch.aten.mul.Scalar %5, %float : !torch.vtensor<[?,16],f32>, !torch.float -> !torch.vtensor<[?,16],f32>
  %7 = torch.aten.add.Tensor %1, %6, %int1 : !torch.vtensor<[?,16],f32>, !torch.vtensor<[?,16],f32>, !torch.int -> !torch.vtensor<[?,16],f32>
  %8 = torch.aten.matmul %arg5, %2 : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,2],f32> -> !torch.vtensor<[?,2],f32>
  %9 = torch.aten.matmul %8, %4 : !torch.vtensor<[?,2],f32>, !torch.vtensor<[2,16],f32> -> !torch.vtensor<[?,16],f32>
  %10 = torch.aten.matmul %arg5, %arg3 : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,16],f32> -> !torch.vtensor<[?,16],f32>
  %11 = torch.aten.matmul %10, %arg4 : !torch.vtensor<[?,16],f32>, !torch.vtensor<[16,4],f32> -> !torch.vtensor<[?,4],f32>
  return %7, %9, %11 : !torch.vtensor<[?,16],f32>, !torch.vtensor<[?,16],f32>, !torch.vtensor<[?,4],f32>
}
